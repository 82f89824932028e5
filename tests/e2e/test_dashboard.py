"""Every query of the Grafana dashboard, run by Prometheus' engine over the driver's own series.

The driver (profile h100x8-mig) prepares a whole GPU for a pod of two containers and a MIG
device for another, and refuses a third claim's configuration; the MIG pod is deleted while the
test scrapes, so prepare, unprepare and a prepare error all happen inside the scraped window.
Its /metrics is scraped every two seconds the whole time, as Prometheus would scrape it (job and
instance labels, honor_labels). The DCGM series the join panels need are synthesized, as
dcgm-exporter names and labels them, from the fake GPUs' UUIDs and MIG instances: no
dcgm-exporter runs here. Each query is interpolated as Grafana does (the test's node and
namespace, then "All") and run as a range query by promeval (Prometheus' parser, text parser,
TSDB and engine). It must parse, evaluate without error, and name only metrics the project
exports (or DCGM's); a query whose metrics all have series in the scrapes must show data: a
series with at least one finite point.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from localcluster import grafana
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, wait_for
from localcluster.workloads import DRIVER, claim_template, claims_pod, ensure_device_classes, gpu_pod

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import MigDevice

PROFILE = "h100x8-mig"
SCRAPE_INTERVAL_MS = 2000
PREPARE_ERRORS = "nvidia_dra_node_prepare_errors_total{"
DCGM_TARGET = {"job": "dcgm-exporter", "instance": "dcgm-exporter:9400"}


@pytest.fixture(scope="module")
def driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverProcess]:
    """The driver on h100x8-mig, sampling the join metric every second."""
    ensure_device_classes(kube)
    process = DriverProcess(
        cluster,
        PROFILE,
        tmp_path_factory.mktemp("dashboard") / "driver.log",
        extra_args=("--claim-metrics-interval=1",),
    ).start()
    yield process
    # The test's namespace is deleted without waiting: its pods' claims are unprepared by this
    # driver before it stops, or they stay in the node's checkpoint and a later test's device
    # plugin on the node refuses to start over GPUs still prepared for DRA.
    wait_for("the kubelet to unprepare the module's claims", lambda: not process.checkpointed(), timeout=60)
    assert process.stop() == 0, process.log_path.read_text()


def dcgm_exposition(cluster: ClusterInfo, step: int) -> str:
    """dcgm-exporter's answer for the fake GPUs: a GPU in MIG mode reports per MIG device (with
    GPU_I_ID and GPU_I_PROFILE), any other GPU as a whole; values change with each step."""
    inventory = discover(FakeGpuLibrary(load_profile(PROFILE), cluster.node_name))
    migs = [d for d in inventory.devices if isinstance(d, MigDevice)]
    split = {m.parent.uuid for m in migs}
    rows = [
        (gpu.index, gpu.uuid, gpu.product_name, "", "") for gpu in inventory.gpus if gpu.uuid not in split
    ]
    rows += [
        (m.parent.index, m.parent.uuid, m.parent.product_name, str(m.gpu_instance_id), m.profile)
        for m in migs
    ]
    lines = []
    # Engine activity (a ratio) in tenths, framebuffer used in MiB, both moving each step.
    for name, scale, period in (
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.1, 10),
        ("DCGM_FI_DEV_FB_USED", 1024.0, 5),
    ):
        lines += [f"# HELP {name} synthesized for the dashboard test", f"# TYPE {name} gauge"]
        for i, (index, uuid, model, instance, profile) in enumerate(rows):
            labels = f'gpu="{index}",UUID="{uuid}",device="nvidia{index}",modelName="{model}"'
            labels += f',Hostname="{cluster.node_name}"'
            if instance:
                labels += f',GPU_I_PROFILE="{profile}",GPU_I_ID="{instance}"'
            lines.append(f"{name}{{{labels}}} {scale * ((i + step) % period)}")
    return "\n".join(lines) + "\n"


class Scraper:
    """Scrapes the driver (and the synthesized dcgm-exporter) every SCRAPE_INTERVAL_MS."""

    def __init__(self, driver: DriverProcess, cluster: ClusterInfo) -> None:
        self.driver = driver
        self.cluster = cluster
        self.scrapes: list[grafana.Scrape] = []
        self.target = {"job": "dra-gpu", "instance": f"127.0.0.1:{driver.port}"}

    def scrape(self) -> str:
        """One scrape of both targets at the same time; the driver's text."""
        now = int(time.time() * 1000)
        text = self.driver.metrics()
        self.scrapes.append(grafana.Scrape(self.target, now, text))
        self.scrapes.append(
            grafana.Scrape(DCGM_TARGET, now, dcgm_exposition(self.cluster, len(self.scrapes)))
        )
        return text

    def until(self, what: str, done: Callable[[str], bool], timeout: float = 60) -> None:
        """Scrape at the interval until `done` holds for the driver's text."""
        deadline = time.monotonic() + timeout
        while not done(self.scrape()):
            assert time.monotonic() < deadline, f"{what}: not after {timeout}s"
            time.sleep(SCRAPE_INTERVAL_MS / 1000)

    def times(self, count: int) -> None:
        """Scrape `count` more times at the interval."""
        for _ in range(count):
            time.sleep(SCRAPE_INTERVAL_MS / 1000)
            self.scrape()


def _configured_template(kube: Kube, namespace: str, name: str, parameters: Obj) -> None:
    """A template of one whole GPU with this opaque configuration for the driver."""
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                        "config": [{"opaque": {"driver": DRIVER, "parameters": parameters}}],
                    }
                }
            },
        }
    )


def _holders(text: str, namespace: str) -> set[str]:
    return {
        line.split('pod="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("dra_gpu_claim_device_info{") and f'dra_claim_namespace="{namespace}"' in line
    }


def test_every_panel_query_parses_evaluates_and_shows_the_drivers_series(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    scraper = Scraper(driver, cluster)
    scraper.scrape()
    claim_template(kube, namespace, "gpu", [])
    claim_template(
        kube,
        namespace,
        "mig",
        [f'device.attributes["{DRIVER}"].profile == "1g.10gb"'],
        device_class="mig.nvidia.com",
    )
    # Two containers of one pod on one claim: two join series for one device, which a join
    # that takes dra_gpu_claim_device_info as its "one" side would refuse (many-to-many).
    claims_pod(
        kube, namespace, "train", {"gpu": "gpu"}, {"main": [{"name": "gpu"}], "side": [{"name": "gpu"}]}
    )
    gpu_pod(kube, namespace, "infer", "mig")
    # A configuration prepare refuses (no webhook here to refuse it first): the error panels' series.
    bogus = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "Bogus"},
    }
    _configured_template(kube, namespace, "bogus", bogus)
    gpu_pod(kube, namespace, "refused", "bogus")
    scraper.until(
        "both pods in the join metric and a prepare refused",
        lambda text: _holders(text, namespace) >= {"train", "infer"} and PREPARE_ERRORS in text,
    )
    scraper.times(2)
    kube.delete("v1", "Pod", "infer", namespace)
    scraper.until("the MIG claim unprepared", lambda text: "infer" not in _holders(text, namespace))
    scraper.times(4)

    dashboard = grafana.load()
    driver_scrapes = [s for s in scraper.scrapes if s.target == scraper.target]
    exposed = frozenset().union(*(grafana.exposition_names(s.text) for s in driver_scrapes))
    start, end = scraper.scrapes[0].time_ms, scraper.scrapes[-1].time_ms
    # Grafana's $__interval is never below the data source's scrape interval: the step.
    step = SCRAPE_INTERVAL_MS
    builtins = grafana.builtins(step, SCRAPE_INTERVAL_MS, end - start)

    variables = grafana.variables(dashboard)
    assert {v.name for v in variables} == {"node", "namespace"}
    answers = grafana.evaluate(scraper.scrapes, [v.selector for v in variables], start, end, step)
    offered = {
        v.name: {s["labels"].get(v.label) for s in a.series} for v, a in zip(variables, answers, strict=True)
    }
    assert cluster.node_name in offered["node"], offered
    assert namespace in offered["namespace"], offered

    panels = grafana.panel_queries(dashboard)
    by_variable = {v.name: v for v in variables}
    selections: dict[str, dict[str, str]] = {
        "selected": {
            "node": grafana.interpolate(by_variable["node"], [cluster.node_name]),
            "namespace": grafana.interpolate(by_variable["namespace"], [namespace]),
        },
        "all": {name: grafana.interpolate(v, grafana.ALL) for name, v in by_variable.items()},
    }
    problems: list[str] = []
    shown: dict[str, list[str]] = {}
    for selection, values in selections.items():
        exprs = [grafana.substitute(p.expr, {**values, **builtins}) for p in panels]
        answers = grafana.evaluate(scraper.scrapes, exprs, start, end, step)
        for panel, answer in zip(panels, answers, strict=True):
            where = f"{panel.title!r} ({selection}): {answer.expr}"
            if answer.parse_error or answer.error:
                problems.append(f"{where}: {answer.parse_error or answer.error}")
                continue
            if unknown := grafana.unknown_metrics(answer, exposed):
                problems.append(f"{where}: names {unknown}, which the project does not export")
            ours = [m for m in answer.metrics if not m.startswith(grafana.DCGM_PREFIX)]
            if not set(ours) <= exposed:
                continue
            if not any(s["finite"] for s in answer.series):
                problems.append(f"{where}: no data, though the driver exports {ours}")
            shown.setdefault(selection, []).append(panel.title)
    assert not problems, "\n".join(problems)
    # The panels with data under "All" are those of the metrics the driver has series of now;
    # the usage panels join them once the driver exports the usage series.
    assert shown["selected"] == shown["all"]
    dcgm = [p.title for p in panels if "DCGM_" in p.expr]
    assert dcgm
    assert set(dcgm) <= set(shown["all"]), shown
    # The join as issue 27 first wrote it, with dra_gpu_claim_device_info on the "one" side,
    # fails as soon as two containers use one device; the panels join the other way round.
    [issue] = grafana.evaluate(
        scraper.scrapes,
        [
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE * on(UUID, GPU_I_ID) group_left(namespace, pod, container, "
            "dra_claim_namespace, dra_claim_name) dra_gpu_claim_device_info"
        ],
        start,
        end,
        step,
    )
    assert "many-to-many matching not allowed" in issue.error
