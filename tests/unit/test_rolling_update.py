"""Two kubelet-plugin instances on one node during a rolling update, on real files and real flocks.

Two DeviceStates (or CheckpointStores, publishers) in one test stand for the two
processes: flock locks belong to open files, so separate opens conflict even in
one process, and each state has its own thread lock as each process would.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import grpc
import pytest

from dra.adapters.assignmentrecord import AssignmentConflictError, AssignmentRecord
from dra.adapters.checkpoint import CheckpointError, CheckpointStore
from dra.adapters.nodefiles import LockTimeoutError, exclusive
from dra.cli.parser import parse_args
from dra.core import versions
from dra.core.assignment import GpuPath
from dra.core.versions import ApiFeatures
from dra.daemon.flags import UsageError, boolean
from dra.daemon.health import HealthTracker
from dra.daemon.sockets import MAX_GRPC_SOCKET_PATH, check_socket_path, is_abandoned
from dra.kubeletplugin.publisher import SlicePublisher
from dra.kubeletplugin.server import PluginServer, sockets
from dra.kubeletplugin.service import DraService, HealthService
from dra.model.allocation import ClaimError
from dra.model.node import ClaimRead
from dra.model.prepared import PreparedClaim
from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc
from tests.unit.helpers import DRIVER, NODE, inventory
from tests.unit.test_publisher import FakeKube
from tests.unit.test_state import UID_A, UID_B, UID_C, Paths, _allocation


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return Paths(tmp_path)


def test_a_claim_prepared_by_one_instance_is_seen_by_the_other(paths: Paths) -> None:
    old, new = paths.state(), paths.state()
    old.prepare(_allocation(UID_A, "gpu-0"))
    with pytest.raises(ClaimError, match="device gpu-0 is already prepared for claim team-a/claim-a"):
        new.prepare(_allocation(UID_B, "gpu-0"))
    assert set(new.prepared) == {UID_A}


def test_a_claim_prepared_by_one_instance_is_unprepared_by_the_other(paths: Paths) -> None:
    old, new = paths.state(), paths.state()
    old.prepare(_allocation(UID_A, "gpu-0"))
    new.unprepare(UID_A)
    assert paths.checkpointed() == {}
    assert not paths.spec(UID_A).exists()
    # The old instance, asked again (the kubelet retries), sees that it is gone.
    assert old.unprepare(UID_A) is None
    old.prepare(_allocation(UID_B, "gpu-0"))
    assert set(paths.checkpointed()) == {UID_B}


def test_neither_instance_loses_the_others_claims(paths: Paths) -> None:
    old, new = paths.state(), paths.state()
    old.prepare(_allocation(UID_A, "gpu-0"))
    new.prepare(_allocation(UID_B, "gpu-1"))
    assert set(paths.checkpointed()) == {UID_A, UID_B}
    # The old instance sees the new one's claim as the holder of its device, and changes nothing.
    asked: list[str] = []

    def live(holders: Sequence[PreparedClaim]) -> Mapping[str, ClaimRead]:
        asked.extend(c.uid for c in holders)
        return {}

    with pytest.raises(ClaimError):
        old.prepare(_allocation(UID_C, "gpu-1"), live)
    assert asked == [UID_B]
    assert set(paths.checkpointed()) == {UID_A, UID_B}


def test_concurrent_prepares_of_one_device_by_two_instances_hand_it_out_once(paths: Paths) -> None:
    states = [paths.state(), paths.state()]
    uids = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(40)]
    won: list[str] = []

    def compete(i: int) -> None:
        for uid in uids[i::2]:
            try:
                states[i].prepare(_allocation(uid, "gpu-3"))
                won.append(uid)
            except ClaimError:
                pass

    threads = [threading.Thread(target=compete, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert set(paths.checkpointed()) == set(won)


def test_a_checkpoint_held_too_long_by_the_other_instance_is_a_clear_error(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json")
    with (
        exclusive(store.lock_path, 1.0),
        pytest.raises(CheckpointError, match="cannot lock checkpoint"),
        store.exclusive(timeout=0.05),
    ):
        pass


def test_exclusive_times_out_naming_the_file(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    with (
        exclusive(lock, 1.0),
        pytest.raises(LockTimeoutError, match=r"x\.lock stayed locked"),
        exclusive(lock, 0.05),
    ):
        pass


def test_instances_with_rolling_updates_share_the_lease_and_keep_the_newer_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = AssignmentRecord(tmp_path)
    gpus = list(inventory("mixed").gpus)
    # Each pod has its own host name (and, in its container, often the same PID).
    monkeypatch.setattr(socket, "gethostname", lambda: "dra-gpu-old")
    old = record.lease(GpuPath.DRA, gpus, NODE, shared=True)
    monkeypatch.setattr(socket, "gethostname", lambda: "dra-gpu-new")
    new = record.lease(GpuPath.DRA, gpus[:2], NODE, shared=True)
    monkeypatch.setattr(socket, "gethostname", lambda: "dra-gpu-old")
    old.release()
    assert record.alive(GpuPath.DRA)
    entry = record.read()["dra"]
    assert (entry["host"], [g["index"] for g in entry["gpus"]]) == ("dra-gpu-new", [0, 1])
    monkeypatch.setattr(socket, "gethostname", lambda: "dra-gpu-new")
    new.release()
    assert not record.alive(GpuPath.DRA)
    assert "dra" not in record.read()


def test_an_instance_with_rolling_updates_waits_for_no_exclusive_one(tmp_path: Path) -> None:
    record = AssignmentRecord(tmp_path)
    gpus = list(inventory("mixed").gpus)
    exclusive_one = record.lease(GpuPath.DRA, gpus, NODE)
    with pytest.raises(AssignmentConflictError, match="without rolling updates runs on this node"):
        record.lease(GpuPath.DRA, gpus, NODE, wait=0.1, shared=True)
    exclusive_one.release()


def test_each_instance_has_its_own_sockets_named_as_the_go_helper_names_them() -> None:
    root = Path("/var/lib/kubelet")
    dra, reg = sockets(root, DRIVER, "5f1c")
    assert dra == root / "plugins" / DRIVER / "dra-5f1c.sock"
    assert reg == root / "plugins_registry" / f"{DRIVER}-5f1c-reg.sock"
    assert sockets(root, DRIVER, None) == (
        root / "plugins" / DRIVER / "dra.sock",
        root / "plugins_registry" / f"{DRIVER}-reg.sock",
    )


def test_an_instance_id_too_long_for_a_socket_path_is_shortened_to_a_stable_digest() -> None:
    # A kubelet root of 29 bytes (the local cluster's on containerd) takes the pod's UID to 107 bytes.
    root = Path("/" + "k" * 28)
    pod_uid = "0b5d9e1e-2f8c-4a55-9c0e-8f1b2a3c4d5e"
    dra, reg = sockets(root, DRIVER, pod_uid)
    assert pod_uid not in str(reg)
    assert len(str(reg)) <= MAX_GRPC_SOCKET_PATH
    assert (dra, reg) == sockets(root, DRIVER, pod_uid)
    assert sockets(root, DRIVER, pod_uid[::-1]) != (dra, reg)


def test_grpc_serves_on_the_longest_path_the_check_lets_through() -> None:
    # A directory of its own under /tmp (short, unlike pytest's tmp_path): runs side by side never meet.
    directory = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    longest = directory / ("s" * (MAX_GRPC_SOCKET_PATH - len(f"{directory}/")))
    try:
        for path, served in ((longest, True), (Path(f"{longest}x"), False)):
            server = grpc.server(ThreadPoolExecutor(max_workers=1))
            try:
                bound = True
                try:
                    server.add_insecure_port(f"unix://{path}")
                except RuntimeError:
                    bound = False
                assert bound is served
                if served:
                    check_socket_path(path, "--kubelet-root")
                else:
                    with pytest.raises(ValueError, match=f"at most {MAX_GRPC_SOCKET_PATH}"):
                        check_socket_path(path, "--kubelet-root")
            finally:
                server.stop(None)
    finally:
        shutil.rmtree(directory)


def test_a_socket_nobody_serves_is_abandoned_and_a_served_one_is_not(tmp_path: Path) -> None:
    served, dead = tmp_path / "served.sock", tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(served))
        server.listen()
        with socket.socket(socket.AF_UNIX) as gone:
            gone.bind(str(dead))
        assert not is_abandoned(served)
        assert is_abandoned(dead)
    assert not is_abandoned(tmp_path / "missing.sock")


@pytest.mark.anyio
async def test_the_newer_instance_stands_by_until_the_publishing_one_ends(tmp_path: Path) -> None:
    kube_old, kube_new = FakeKube(), FakeKube()
    turn = tmp_path / "publisher.lock"
    old = SlicePublisher(kube_old, DRIVER, NODE, inventory("mixed"), ApiFeatures(), turn=turn)  # type: ignore[arg-type]
    new = SlicePublisher(kube_new, DRIVER, NODE, inventory("mixed"), ApiFeatures(), turn=turn)  # type: ignore[arg-type]
    async with anyio.create_task_group() as group:
        old_scope = anyio.CancelScope()

        async def run_old() -> None:
            with old_scope:
                await old.run()

        group.start_soon(run_old)
        await old.published.wait()
        group.start_soon(new.run)
        await new.settled.wait()
        assert new.standing_by
        assert kube_new.server.list() == []
        old_scope.cancel()
        with anyio.fail_after(5):
            await new.published.wait()
        assert not new.standing_by
        assert len(kube_new.server.list()) == 1
        group.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("kubelet", "refused"), [("v1.32.4", True), ("v1.33.0", False), ("v1.34.12", False), ("", False)]
)
def test_rolling_updates_need_a_kubelet_of_1_33(kubelet: str, refused: bool) -> None:
    refusal = versions.rolling_update_refusal(kubelet)
    assert (refusal is not None) == refused
    if refusal is not None:
        assert "--rolling-update=false" in refusal
        assert "kubeletPlugin.rollingUpdate=false" in refusal


@pytest.mark.parametrize(("text", "value"), [("true", True), ("On", True), ("0", False), ("no", False)])
def test_boolean_flags(text: str, value: bool) -> None:
    assert boolean(text) is value


def test_a_bad_boolean_flag_is_refused() -> None:
    with pytest.raises(ValueError, match="expected true or false"):
        boolean("maybe")


def test_rolling_updates_are_on_by_default_and_the_chart_can_turn_them_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = parse_args(["kubelet-plugin", "--node-name=n", "--instance-id=pod-uid"])
    assert (args.rolling_update, args.instance_id) == (True, "pod-uid")
    monkeypatch.setenv("DRA_GPU_ROLLING_UPDATE", "false")
    assert parse_args(["kubelet-plugin", "--node-name=n"]).rolling_update is False
    monkeypatch.setenv("DRA_GPU_ROLLING_UPDATE", "sometimes")
    with pytest.raises(UsageError, match="DRA_GPU_ROLLING_UPDATE='sometimes': expected true or false"):
        parse_args(["kubelet-plugin", "--node-name=n"])


class SlowClaims:
    """The service's API calls: a ResourceClaim of this driver on gpu-0, answered once `answer` is set."""

    def __init__(self) -> None:
        # Threads' events: the claim is read on the gRPC server's thread.
        self.asked = threading.Event()
        self.answer = threading.Event()

    def read_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.asked.set()
        self.answer.wait(10)
        result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
        return {
            "metadata": {"namespace": namespace, "name": name, "uid": UID_A},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }

    def write_event(self, involved: dict[str, Any], reason: str, message: str, *, host: str = "") -> None:
        """No events: the prepare succeeds."""


@pytest.mark.anyio
async def test_sigterm_answers_the_prepare_in_flight_before_withdrawing_the_registration() -> None:
    # A short root: unix socket paths are limited, pytest's tmp_path is long.
    root = Path(tempfile.mkdtemp(prefix="dra-ru-", dir="/tmp"))
    try:
        paths = Paths(root)
        claims = SlowClaims()
        dra = DraService(DRIVER, NODE, paths.state(), claims)
        health = HealthService(NODE, HealthTracker(inventory("h100x8-mig")))
        server = PluginServer(root / "kubelet", DRIVER, dra, health, instance_id="old")
        server.start()
        answers: list[dra_pb2.NodePrepareResourcesResponse] = []

        async def prepare() -> None:
            async with grpc.aio.insecure_channel(f"unix://{server.dra_socket}") as channel:
                stub = dra_pb2_grpc.DRAPluginStub(channel)
                ref = dra_pb2.Claim(namespace="team-a", name="claim-a", uid=UID_A)
                request = dra_pb2.NodePrepareResourcesRequest(claims=[ref])
                answers.append(await stub.NodePrepareResources(request))

        async with anyio.create_task_group() as group:
            group.start_soon(prepare)
            assert await anyio.to_thread.run_sync(claims.asked.wait, 5)
            group.start_soon(server.stop)
            await anyio.sleep(0.3)
            # Still registered: the kubelet would cut the call if the registration went now.
            assert server.registration_socket.exists()
            claims.answer.set()
        [answer] = answers
        assert answer.claims[UID_A].error == ""
        assert [d.device_name for d in answer.claims[UID_A].devices] == ["gpu-0"]
        assert not server.registration_socket.exists()
        assert not server.dra_socket.exists()
    finally:
        shutil.rmtree(root)
