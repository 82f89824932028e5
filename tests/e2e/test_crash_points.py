"""Crash-point matrix: the driver dies at every durable step, restarts, and the kubelet's retry converges.

Each case arms one crash point of dra.adapters.nodefiles (DRA_GPU_FAULT_POINT) in the
real kubelet-plugin process, drives a NodePrepareResources or
NodeUnprepareResources call over its socket into that point (the process ends
with os._exit(137), as kill -9 would), restarts it (optionally into a second
crash inside the start-up repair), and calls again as the kubelet does: it
retries a failed call until it succeeds. Then it checks what the next pod and
the next claim see: the claim's CDI spec and checkpoint entry agree, no
half-written file remains, the device is refused to a second claim while the
first holds it, and an unprepare leaves nothing behind.

The cases come from a table; a test compares the table (and the points that
another e2e test crashes at, COVERED_ELSEWHERE) with every
``nodefiles.point("...")`` in dra/, so a new point without a case fails.
"""

from __future__ import annotations

import ast
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc

DRIVER = "crash.dra-gpu.test"
DEVICE = "gpu-3"
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    """One crash: where it is armed, which call runs into it, and what it leaves."""

    #: The DRA_GPU_FAULT_POINT value: a point name, or NAME:N for its N-th hit. Every start
    #: leases the GPUs with one atomic write, so a prepare's CDI spec is write 2; the
    #: checkpoint exists before the crash, so its save appends (checkpoint.appended), and
    #: its atomic snapshot (compaction) is covered by tests/unit/test_checkpoint.py.
    arm: str
    #: "prepare", "release" (a prepare that releases a deleted claim's device) or "unprepare".
    call: str
    #: A point armed on the first restart, inside the start-up repair; that start dies too.
    restart_arm: str | None = None
    #: The directory ("cdi" or "state") where the crash leaves a temporary file.
    leftover: str | None = None
    #: The driver runs with --device-metadata (KEP-5304): the claim's files are steps too.
    metadata: bool = False

    @property
    def point(self) -> str:
        """The point's name without the hit count."""
        return self.arm.partition(":")[0]


CASES = [
    Case("prepare.before-cdi-write", "prepare"),
    Case("prepare.cdi-written", "prepare"),
    Case("prepare.checkpoint-saved", "prepare"),
    Case("prepare.stale-spec-removed", "release"),
    Case("unprepare.spec-removed", "unprepare"),
    Case("unprepare.checkpoint-saved", "unprepare"),
    Case("atomicfile.temp-written:2", "prepare", leftover="cdi"),
    Case("atomicfile.renamed:2", "prepare"),
    Case("checkpoint.appended", "prepare"),
    Case("checkpoint.appended", "unprepare"),
    Case("atomicfile.removed", "unprepare"),
    Case("atomicfile.removed", "release"),
    Case("atomicfile.temp-written:2", "prepare", restart_arm="recover.leftovers-removed", leftover="cdi"),
    Case("prepare.cdi-written", "prepare", restart_arm="recover.spec-removed"),
    Case("unprepare.spec-removed", "unprepare", restart_arm="recover.spec-written"),
    Case("prepare.metadata-written", "prepare", metadata=True),
    Case("unprepare.metadata-removed", "unprepare", metadata=True),
    Case("prepare.metadata-written", "prepare", restart_arm="recover.metadata-removed", metadata=True),
    Case("unprepare.spec-removed", "unprepare", restart_arm="recover.metadata-written", metadata=True),
]

#: Points whose crash case lives in another test, which needs a set-up this matrix lacks
#: (a claim asking time slices or MPS, a dynamic-MIG GPU): the test that kills the driver there.
COVERED_ELSEWHERE = {
    "sharing-before-gpu-settings": "tests/e2e/test_sharing.py",
    "sharing-before-unrecord": "tests/e2e/test_sharing.py",
    "mps-daemon-started": "tests/unit/test_mps.py",
    "mig-intent-recorded": "tests/unit/test_dynamic_mig_state.py",
    "mig-gpu-instance-created": "tests/unit/test_dynamic_mig_state.py",
    "mig-compute-instance-created": "tests/unit/test_dynamic_mig_state.py",
    "mig-recorded": "tests/unit/test_dynamic_mig_state.py",
    "mig-destroyed": "tests/unit/test_dynamic_mig_state.py",
    "mig-made-again": "tests/unit/test_dynamic_mig_state.py",
    "mig-mode-intent-recorded": "tests/unit/test_dynamic_mig_state.py",
    "mig-mode-set": "tests/unit/test_dynamic_mig_state.py",
    "mig-mode-recorded": "tests/unit/test_dynamic_mig_state.py",
    "mig-mode-undone": "tests/unit/test_dynamic_mig_state.py",
    "miglayout.mode-set": "tests/unit/test_miglayout.py",
    "miglayout.destroyed": "tests/unit/test_miglayout.py",
    "miglayout.gpu-instance-created": "tests/unit/test_miglayout.py",
    "miglayout.compute-instance-created": "tests/unit/test_miglayout.py",
    # Passthrough needs a fake sysfs with an IOMMU; the programs are ended before each of their steps there.
    "vfio-intent-recorded": "tests/unit/test_prepare_steps.py",
    "vfio-sibling-unbound": "tests/unit/test_prepare_steps.py",
    "vfio-bound": "tests/unit/test_prepare_steps.py",
    "vfio-recorded": "tests/unit/test_prepare_steps.py",
    "vfio-released": "tests/unit/test_prepare_steps.py",
    "vfio-sibling-restored": "tests/unit/test_prepare_steps.py",
}


def _points_in_source() -> set[str]:
    """Every name passed to nodefiles.point in the package, every step's `point=` and every `mark(...)`.

    A step's runner passes its point (`nodefiles.Step`, whose exit calls `point(self._point)`); a
    program names it where it calls the step, or marks a place between two steps.
    """
    names: set[str] = set()
    for path in (REPO / "dra").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            names.update(n for k in node.keywords if k.arg == "point" and (n := _literal(k.value)))
            if isinstance(node.func, ast.Attribute) and node.func.attr == "mark" and node.args:
                names.update(n for n in [_literal(node.args[0])] if n)
            # nodefiles.point(...) in the other modules, point(...) inside nodefiles itself.
            if (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "point"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "nodefiles"
            ) or (isinstance(node.func, ast.Name) and node.func.id == "point"):
                name = node.args[0] if len(node.args) == 1 else None
                if ast.unparse(node) == "point(self._point)":
                    continue
                assert isinstance(name, ast.Constant), (
                    f"{path}:{node.lineno}: a fault point needs a literal name, for this matrix to find it"
                )
                names.add(str(name.value))
    return names


def _literal(node: ast.expr) -> str:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def test_every_fault_point_has_a_case() -> None:
    covered = (
        {c.point for c in CASES} | {c.restart_arm for c in CASES if c.restart_arm} | set(COVERED_ELSEWHERE)
    )
    found = _points_in_source()
    assert found, "no nodefiles.point calls found in dra/"
    assert found - covered == set(), "fault points without a crash case in CASES"
    assert covered - found == set(), "crash cases for points that no longer exist"


@pytest.fixture(scope="module")
def driver(cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DriverProcess]:
    """The driver under its own name (not started: each case starts it as it needs)."""
    process = DriverProcess(cluster, "h100x8", tmp_path_factory.mktemp("crash") / "driver.log", DRIVER)
    yield process
    process.stop()


def _claim(kube: Kube, namespace: str, node: str) -> Obj:
    """A ResourceClaim allocated DEVICE of this driver, written into its status as the scheduler would."""
    claim = kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"claim-{uuid.uuid4().hex[:6]}", "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "any"}}]}},
        }
    )
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": DEVICE}
    claim["status"] = {"allocation": {"devices": {"results": [result]}}}
    return kube.replace_status(claim)


def _ref(claim: Obj) -> dra_pb2.Claim:
    meta = claim["metadata"]
    return dra_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def _call(driver: DriverProcess, method: str, claim: Obj) -> str:
    """One kubelet call for one claim; its per-claim error ("" on success)."""
    socket = driver.dra_socket
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_pb2_grpc.DRAPluginStub(channel)
        if method == "prepare":
            prepared = stub.NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(claims=[_ref(claim)]), timeout=20
            )
            return prepared.claims[claim["metadata"]["uid"]].error
        unprepared = stub.NodeUnprepareResources(
            dra_pb2.NodeUnprepareResourcesRequest(claims=[_ref(claim)]), timeout=20
        )
        return unprepared.claims[claim["metadata"]["uid"]].error


def _start(driver: DriverProcess, arm: str | None = None, metadata: bool = False) -> None:
    driver.env = {"DRA_GPU_FAULT_POINT": arm} if arm else {}
    if metadata:
        driver.env["DRA_GPU_DEVICE_METADATA"] = "true"
    driver.start()


def _metadata_files(driver: DriverProcess) -> list[str]:
    """Every file under the driver's device metadata directory, temporary ones too."""
    root = driver.checkpoint.parent / "dra-device-metadata"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def _assert_crashed_at(driver: DriverProcess, point: str) -> None:
    assert driver.proc is not None
    assert driver.proc.wait(20) == 137, driver.log_path.read_text()[-3000:]
    assert f"fault point {point}: exiting" in driver.log_path.read_text()


def _leftovers(cdi: Path, state: Path) -> dict[str, list[str]]:
    return {
        "cdi": sorted(p.name for p in cdi.glob(".*.tmp")),
        "state": sorted(p.name for p in state.glob(".*.tmp")),
    }


def _prepared(driver: DriverProcess) -> set[str]:
    return set(CheckpointStore(driver.checkpoint).load())


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c.call}-{c.arm}" + (f"-{c.restart_arm}" if c.restart_arm else "")
)
def test_crash_converges(
    case: Case, driver: DriverProcess, kube: Kube, namespace: str, cluster: ClusterInfo
) -> None:
    cdi = CdiStore(Path(cluster.cdi_dir), DRIVER)
    claim = _claim(kube, namespace, cluster.node_name)
    uid = claim["metadata"]["uid"]

    _start(driver, metadata=case.metadata)
    if case.call == "release":
        # A claim prepared, then deleted without an unprepare: the next claim of its device releases it.
        holder = _claim(kube, namespace, cluster.node_name)
        assert _call(driver, "prepare", holder) == ""
        kube.delete("resource.k8s.io/v1", "ResourceClaim", holder["metadata"]["name"], namespace)
    if case.call == "unprepare":
        assert _call(driver, "prepare", claim) == ""
    driver.stop()
    if not driver.checkpoint.exists():
        # As after any earlier prepare on the node: the armed call's save appends to it.
        CheckpointStore(driver.checkpoint).save({})

    method = "unprepare" if case.call == "unprepare" else "prepare"
    _start(driver, case.arm, case.metadata)
    with pytest.raises(grpc.RpcError) as dropped:
        _call(driver, method, claim)
    assert dropped.value.code() == grpc.StatusCode.UNAVAILABLE
    _assert_crashed_at(driver, case.point)
    if case.leftover is not None:
        assert _leftovers(cdi.root, driver.checkpoint.parent)[case.leftover], "the crash left no temp file"

    if case.restart_arm is not None:
        with pytest.raises(RuntimeError, match="exited with 137"):
            _start(driver, case.restart_arm, case.metadata)
        _assert_crashed_at(driver, case.restart_arm)
    _start(driver, metadata=case.metadata)
    assert _call(driver, method, claim) == ""

    assert _leftovers(cdi.root, driver.checkpoint.parent) == {"cdi": [], "state": []}
    if method == "prepare":
        assert _prepared(driver) == {uid}
        assert cdi.claim_uids() == [uid]
        if case.metadata:
            assert _metadata_files(driver) == [f"{namespace}_{claim['metadata']['name']}/gpu/metadata.json"]
        rival = _claim(kube, namespace, cluster.node_name)
        refused = _call(driver, "prepare", rival)
        assert f"device {DEVICE} is already prepared for claim {namespace}/{claim['metadata']['name']}" in (
            refused
        )
        assert rival["metadata"]["uid"] not in _prepared(driver)
        assert _call(driver, "unprepare", claim) == ""
    assert _prepared(driver) == set()
    assert cdi.claim_uids() == []
    assert _metadata_files(driver) == []
    assert driver.stop() == 0, driver.log_path.read_text()[-3000:]
