"""Shared fixtures: the local Kubernetes cluster, a client for it, a namespace per test.

The cluster starts once per test session (built on first use) with the
feature gates of --feature-gates / DRA_GPU_FEATURE_GATES on top of the
harness defaults. Every test that uses it is marked `cluster`.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc.aio
import pytest
from hypothesis import HealthCheck, settings
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.kube import Kube, wait_for
from localcluster.kubereleases import parse_gates

from dra.kubeletplugin import mpsprivsep
from tests import skips

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler import Scheduling

# grpc.aio's poller kept for the whole test process: otherwise the last grpc.aio object a test
# releases stops it, on the garbage collector's time in some later test, and that stop can hang on
# a thread join (grpc/grpc#40989: a worker hung so in `make test`); the next starts it again.
grpc.aio.init_grpc_aio()

# Bounded for the default suite (a few seconds per test); HYPOTHESIS_PROFILE=fuzz-long searches longer.
# No example database: a failing example is printed, and nothing is written into the checkout.
settings.register_profile(
    "default-suite",
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("fuzz-long", settings.get_profile("default-suite"), max_examples=3000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default-suite"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--feature-gates",
        default=os.environ.get("DRA_GPU_FEATURE_GATES", ""),
        help="feature gates for the local cluster, e.g. DRADeviceTaints=false",
    )


#: Files a parallel run (pytest-xdist: `make test`) gives whole to one worker: their module fixtures
#: start drivers and clusters once and their tests keep their order, on that worker's session
#: cluster. The other tests go one at a time to whichever worker is free.
WHOLE_FILES = ("tests/e2e/", "tests/integration/")


@pytest.hookimpl(tryfirst=True)  # before -m reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that use the cluster; put the files run whole first, the largest first.

    In that order a parallel run starts the long cluster files at once, and the short tests fill in.
    """
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "cluster" in names or "local_cluster" in names:
            item.add_marker(pytest.mark.cluster)
    sizes = Counter(item.path for item in items)
    # A stable sort: each file's tests stay together and in their order.
    items.sort(key=lambda item: (not item.nodeid.startswith(WHOLE_FILES), -sizes[item.path]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    """pytest-xdist's default distribution (one test at a time), but WHOLE_FILES a file at a time."""
    if config.getvalue("dist") != "load":
        return None  # a --dist the caller chose
    from xdist.scheduler import LoadScopeScheduling

    class Scheduler(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no type information
        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0] if nodeid.startswith(WHOLE_FILES) else nodeid

    return Scheduler(config, log)


def _skip_reasons(reporter: pytest.TerminalReporter) -> Counter[str]:
    """The run's skips by reason (pytest-xdist's controller receives every worker's reports)."""
    found: Counter[str] = Counter()
    for report in reporter.stats.get("skipped", []):
        longrepr = report.longrepr
        text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        found[text.removeprefix("Skipped: ")] += 1
    return found


def _disallowed(reasons: Counter[str]) -> Counter[str]:
    allowed = skips.allowed()
    if allowed is None:
        return Counter()
    return Counter({r: n for r, n in reasons.items() if skips.kind(r) not in allowed})


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Where DRA_GPU_ALLOWED_SKIPS is set (the CI), a skip of another kind fails the run (tests/skips.py)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if hasattr(session.config, "workerinput") or reporter is None:
        return  # a pytest-xdist worker: the controller sees every report
    if _disallowed(_skip_reasons(reporter)) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The count of skipped tests by reason, at the end of every run: no skip goes unseen."""
    if hasattr(terminalreporter.config, "workerinput"):
        return
    reasons = _skip_reasons(terminalreporter)
    if not reasons:
        return
    terminalreporter.section(f"{sum(reasons.values())} skipped, by reason")
    for text, count in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
        terminalreporter.line(f"{count:5d}  {text}")
    disallowed = _disallowed(reasons)
    if disallowed:
        terminalreporter.line(
            f"FAILED: {sum(disallowed.values())} skipped for what {skips.ALLOWED_ENV}="
            f"{os.environ[skips.ALLOWED_ENV]} says this machine has (tests/skips.py)",
            red=True,
            bold=True,
        )


@pytest.fixture(autouse=True)
def _keep_the_test_runners_capabilities(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that runs `kubelet-plugin` in this process (dra.cli.main) would fork an MPS launcher
    and drop CAP_SYS_ADMIN from the runner for good, and every later MPS test would fail; the
    separation itself is tested on real plugin processes (tests/unit/test_mpsprivsep.py)."""
    monkeypatch.setattr(mpsprivsep, "separate", lambda *_: None)


@pytest.fixture(autouse=True)
def _no_stale_log_handler() -> Iterator[None]:
    """A test that runs a command (dra.cli.main) sets the root logger up on that test's captured
    stderr, which pytest closes afterwards: every later record would then print a logging error."""
    level = logging.getLogger().level
    yield
    root = logging.getLogger()
    # pytest's own handlers are subclasses; the command's is a plain StreamHandler.
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler]:
        root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """grpc.aio runs on asyncio only."""
    return "asyncio"


@pytest.fixture(scope="session")
def local_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """The session's cluster itself, for tests that act on its processes (restart_kubelet)."""
    gates = parse_gates(str(request.config.getoption("--feature-gates")))
    # Always the fake runtime: these tests read its records. The `containerd` tests start
    # their own cluster on containerd, whatever CONTAINER_RUNTIME says.
    local = LocalCluster(feature_gates=gates, runtime="fake")
    try:
        local.start()
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="session")
def cluster(local_cluster: LocalCluster) -> ClusterInfo:
    """A running one-node cluster shared by the session."""
    assert local_cluster.info is not None
    return local_cluster.info


@pytest.fixture(scope="session")
def kube(cluster: ClusterInfo) -> Iterator[Kube]:
    """A cluster-admin client."""
    client = Kube(cluster.kubeconfig)
    yield client
    client.close()


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace, deleted (without waiting) after the test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(
        f"default ServiceAccount in {name}",
        lambda: kube.get_or_none("v1", "ServiceAccount", "default", namespace=name),
    )
    yield name
    kube.delete("v1", "Namespace", name)
