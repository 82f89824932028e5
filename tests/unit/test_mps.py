"""MPS: limits checked at prepare, a control daemon per set of devices, adopted on restart, never leaked.

The daemons are the fake nvidia-cuda-mps-control (dra.fakegpus.mpscontrol), started for real, each in
a mount namespace of its own (dra.kubeletplugin.mpslaunch): that takes root, as it takes
CAP_SYS_ADMIN in the plugin's container.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.api.v1beta1 import MpsConfig
from dra.core import cdi, mpsdaemons, sharing
from dra.fakegpus import mpscontrol as fakemps
from dra.kubeletplugin.mps import MpsDaemons
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import AllocatedDevice, ClaimAllocation, ClaimError, OpaqueConfig
from dra.model.quantity import Quantity
from tests.skips import Lack, reason
from tests.unit.helpers import (
    DRIVER,
    FAKE_MPS,
    MPS_CONTROL,
    NODE,
    daemon_devices,
    inventory,
    mps_ask,
    mps_root,
    process_argv,
    stop_mps_daemons,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=reason(Lack.ROOT, "a mount namespace per daemon"))

UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"


def _mps(**mps_config: Any) -> OpaqueConfig:
    return OpaqueConfig(
        "FromClaim",
        (),
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": mps_config},
        },
    )


def _claim(uid: str, *devices: str, config: OpaqueConfig | None = None) -> ClaimAllocation:
    return ClaimAllocation(
        uid=uid,
        namespace="team-a",
        name=f"claim-{uid[0]}",
        devices=tuple(AllocatedDevice("gpu", NODE, d) for d in devices),
        configs=(config,) if config else (),
    )


class Node:
    def __init__(self, root: Path, profile: str = "h100x8") -> None:
        self.root = root
        self.profile = profile
        self.daemons = MpsDaemons(mps_root(root), MPS_CONTROL)

    def state(self, daemons: MpsDaemons | None = None) -> DeviceState:
        state = DeviceState(
            DRIVER,
            NODE,
            inventory(self.profile),
            CdiStore(self.root / "cdi", DRIVER),
            CheckpointStore(self.root / "checkpoint.json"),
            mps=daemons or self.daemons,
        )
        state.recover()
        return state

    def key(self, *devices: str) -> str:
        return sharing.mps_key(_uuid(d) for d in devices)

    def dirs(self, key: str) -> sharing.MpsDirs:
        return sharing.mps_dirs(str(self.daemons.root), key)

    def control_log(self, key: str) -> str:
        return (Path(self.dirs(key).log) / "control.log").read_text()

    def ask(self, key: str, command: str) -> str:
        return mps_ask(self.dirs(key).pipe, command)


def _uuid(device: str) -> str:
    found = inventory("h100x8").get(device)
    assert found is not None
    return found.uuid


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path)
    root = node.daemons.root  # a test may give the node other daemons
    yield node
    stop_mps_daemons(node.daemons)
    shutil.rmtree(root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and not stat.read_text().split(") ")[-1].startswith("Z")


def test_a_claim_gets_its_own_daemon_with_its_limits_and_the_container_is_pointed_at_it(node: Node) -> None:
    state = node.state()
    state.prepare(
        _claim(
            UID_A,
            "gpu-0",
            "gpu-1",
            config=_mps(defaultActiveThreadPercentage=50, defaultPerDevicePinnedMemoryLimit={"1": "8Gi"}),
        )
    )
    pid = node.daemons.pid(node.key("gpu-0", "gpu-1"))
    assert pid is not None
    assert _alive(pid)
    dirs = node.dirs(node.key("gpu-0", "gpu-1"))
    assert sorted(os.listdir(dirs.pipe)) == [
        "control",
        "control_lock",
        "control_privileged",
        "log",
        "nvidia-cuda-mps-control.pid",
    ]
    uuids = [state.inventory.get(n).uuid for n in ("gpu-0", "gpu-1")]  # type: ignore[union-attr]
    assert daemon_devices(pid) == ",".join(uuids)
    key = node.key("gpu-0", "gpu-1")
    assert node.ask(key, "get_default_active_thread_percentage") == "50.0"
    # 8192M as set, read back in the daemon's own unit.
    assert node.ask(key, "get_default_device_pinned_mem_limit 1") == "8G"
    assert node.ask(key, "get_default_device_pinned_mem_limit 0") == ""

    spec = json.loads((node.root / "cdi" / cdi.spec_file_name(DRIVER, UID_A)).read_text())
    edits = spec["containerEdits"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in edits["env"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=1=8192M" in edits["env"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts == {"/tmp/nvidia-mps": dirs.pipe, "/dev/shm": dirs.shm}

    state.unprepare(UID_A)
    assert not _alive(pid)
    assert not Path(dirs.root).exists()


def test_a_per_device_limit_names_a_device_among_those_its_config_applies_to(node: Node) -> None:
    def config(request: str, limit: str) -> OpaqueConfig:
        mps = _mps(defaultPerDevicePinnedMemoryLimit={"0": limit})
        return OpaqueConfig("FromClaim", (request,), mps.parameters)

    claim = ClaimAllocation(
        uid=UID_A,
        namespace="team-a",
        name="claim-a",
        devices=(AllocatedDevice("small", NODE, "gpu-0"), AllocatedDevice("large", NODE, "gpu-1")),
        configs=(config("small", "4Gi"), config("large", "8Gi")),
    )
    node.state().prepare(claim)
    # Each config's "0" is its own first device; the daemon numbers the claim's devices.
    key = node.key("gpu-0", "gpu-1")
    assert node.ask(key, "get_default_device_pinned_mem_limit 0") == "4G"
    assert node.ask(key, "get_default_device_pinned_mem_limit 1") == "8G"


def test_a_restarted_driver_adopts_the_daemon_instead_of_starting_another(node: Node) -> None:
    node.state().prepare(_claim(UID_A, "gpu-0", config=_mps()))
    pid = node.daemons.pid(node.key("gpu-0"))
    restarted = node.state()
    assert node.daemons.pid(node.key("gpu-0")) == pid
    assert node.control_log(node.key("gpu-0")).count("Starting control daemon") == 1
    restarted.unprepare(UID_A)
    assert pid is not None
    assert not _alive(pid)


def test_daemons_of_claims_not_in_the_checkpoint_are_stopped_at_start(node: Node) -> None:
    node.state().prepare(_claim(UID_A, "gpu-0", config=_mps()))
    pid = node.daemons.pid(node.key("gpu-0"))
    # A driver killed after starting the daemon whose checkpoint then lost the claim (or never had it).
    CheckpointStore(node.root / "checkpoint.json").save({})
    node.state()
    assert pid is not None
    assert not _alive(pid)
    assert node.daemons.daemons() == []


def test_a_daemon_that_cannot_start_fails_the_claim_and_leaves_nothing(node: Node, tmp_path: Path) -> None:
    broken = MpsDaemons(node.daemons.root, [str(tmp_path / "no-such-mps-control")])
    state = node.state(broken)
    with pytest.raises(ClaimError, match="no-such-mps-control"):
        state.prepare(_claim(UID_A, "gpu-0", config=_mps()))
    assert state.prepared == {}
    assert not list((node.root / "cdi").glob("*.json"))
    assert broken.daemons() == []


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (_mps(defaultPinnedDeviceMemoryLimit="100Gi"), "defaultPinnedDeviceMemoryLimit: 100Gi is more than"),
        (_mps(defaultPerDevicePinnedMemoryLimit={"3": "1Gi"}), "[3]: names no device of this config"),
        (_mps(defaultPerDevicePinnedMemoryLimit={"GPU-x": "1Gi"}), "[GPU-x]: names no device of this config"),
        (_mps(defaultPinnedDeviceMemoryLimit="10 GB"), '"10 GB" is not a quantity'),
        (_mps(defaultActiveThreadPercentage=0), "defaultActiveThreadPercentage: 0 is outside 1-100"),
    ],
)
def test_bad_limits_are_a_per_claim_error_and_start_nothing(
    node: Node, config: OpaqueConfig, problem: str
) -> None:
    state = node.state()
    with pytest.raises(ClaimError) as err:
        state.prepare(_claim(UID_A, "gpu-0", config=config))
    assert problem in str(err.value)
    assert node.daemons.daemons() == []
    assert state.prepared == {}


def test_a_share_caps_the_pinned_limit_and_is_its_default() -> None:
    gpu = inventory("h100x8").get("gpu-0")
    assert gpu is not None
    settings, problems = sharing.decide_mps([sharing.MpsRequest(gpu, MpsConfig(), (gpu,), "20Gi")])
    assert (settings["gpu-0"].pinned_limit, problems) == ("20480M", [])
    larger = MpsConfig(default_pinned_device_memory_limit=Quantity.parse("30Gi"))
    _, problems = sharing.decide_mps([sharing.MpsRequest(gpu, larger, (gpu,), "20Gi")])
    assert problems == ["device gpu-0: pinned memory limit 30Gi is above its share (20Gi)"]
    smaller = MpsConfig(default_per_device_pinned_memory_limit={gpu.uuid: Quantity.parse("1.5Gi")})
    settings, problems = sharing.decide_mps([sharing.MpsRequest(gpu, smaller, (gpu,), "20Gi")])
    assert (settings["gpu-0"].pinned_limit, problems) == ("1536M", [])


def test_two_claims_on_different_gpus_get_two_daemons(node: Node) -> None:
    state = node.state()
    state.prepare(_claim(UID_A, "gpu-0", config=_mps()))
    state.prepare(_claim(UID_B, "gpu-1", config=_mps()))
    assert node.daemons.pid(node.key("gpu-0")) != node.daemons.pid(node.key("gpu-1"))
    assert node.daemons.daemons() == sorted([node.key("gpu-0"), node.key("gpu-1")])


def test_a_pid_file_naming_another_process_is_not_adopted(node: Node) -> None:
    # After a reboot the pid in a leftover pid file may be any process's, e.g. this one's.
    pipe = Path(node.dirs(node.key("gpu-0")).pipe)
    pipe.mkdir(parents=True)
    (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{os.getpid()}\n")
    assert node.daemons.pid(node.key("gpu-0")) is None
    node.state().prepare(_claim(UID_A, "gpu-0", config=_mps()))
    pid = node.daemons.pid(node.key("gpu-0"))
    assert pid is not None
    assert pid != os.getpid()


def _share(uid: str, device: str, share: str, memory: str = "20Gi", **mps_config: Any) -> ClaimAllocation:
    return ClaimAllocation(
        uid=uid,
        namespace="team-a",
        name=f"claim-{uid[0]}",
        devices=(
            AllocatedDevice("gpu", NODE, device, share_id=share, consumed_capacity=(("memory", memory),)),
        ),
        configs=(_mps(**mps_config),),
    )


SHARE_1 = "11111111-0000-4000-8000-000000000001"
SHARE_2 = "22222222-0000-4000-8000-000000000002"


def test_the_daemons_dev_shm_is_the_claims_shm_directory_not_the_plugins(node: Node) -> None:
    node.state().prepare(_claim(UID_A, "gpu-0", config=_mps()))
    pid = node.daemons.pid(node.key("gpu-0"))
    assert pid is not None
    # What the claim's containers get at /dev/shm (CDI) is what the daemon sees there: looked at
    # through the daemon's own root, which a real daemon has as well as the fake.
    theirs = Path(node.dirs(node.key("gpu-0")).shm) / f"claim-{UID_A}"
    ours = Path("/dev/shm") / f"plugin-{UID_A}"
    theirs.touch()
    ours.touch()
    try:
        assert Path(f"/proc/{pid}/root/dev/shm/{theirs.name}").exists()
        assert not Path(f"/proc/{pid}/root/dev/shm/{ours.name}").exists()
    finally:
        ours.unlink()
    # The daemon's mount namespace is its own: the bind mount is not the plugin's.
    assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")


def test_shares_of_one_gpu_join_one_daemon_with_limits_per_client_until_the_last_goes(node: Node) -> None:
    state = node.state()
    state.prepare(_share(UID_A, "gpu-0", SHARE_1, "20Gi", defaultActiveThreadPercentage=30))
    key = node.key("gpu-0")
    pid = node.daemons.pid(key)
    state.prepare(_share(UID_B, "gpu-0", SHARE_2, "30Gi"))
    assert node.daemons.pid(key) == pid
    assert node.daemons.daemons() == [key]
    log = node.control_log(key)
    assert log.count("Starting control daemon") == 1
    # One claim's limits are not the other's: none is a default of the shared daemon.
    assert "set_default" not in log

    def env(uid: str) -> list[str]:
        spec = json.loads((node.root / "cdi" / cdi.spec_file_name(DRIVER, uid)).read_text())
        return [e for e in spec["containerEdits"]["env"] if e.startswith("CUDA_MPS")]

    assert env(UID_A) == [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
    ]
    assert env(UID_B) == [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=30720M",
    ]

    state.unprepare(UID_A)
    assert node.daemons.pid(key) == pid
    # A restart in between adopts it for the claim left.
    restarted = node.state()
    assert node.daemons.pid(key) == pid
    restarted.unprepare(UID_B)
    assert pid is not None
    assert not _alive(pid)
    assert node.daemons.daemons() == []


def test_a_claim_whose_mps_devices_overlap_a_daemons_other_set_is_refused(node: Node) -> None:
    state = node.state()
    state.prepare(
        ClaimAllocation(
            uid=UID_A,
            namespace="team-a",
            name="claim-a",
            devices=(
                AllocatedDevice("gpu", NODE, "gpu-0", share_id=SHARE_1),
                AllocatedDevice("gpu", NODE, "gpu-1", share_id=SHARE_1),
            ),
            configs=(_mps(),),
        )
    )
    with pytest.raises(ClaimError) as err:
        state.prepare(_share(UID_B, "gpu-0", SHARE_2))
    assert str(err.value) == (
        "cannot prepare ResourceClaim team-a/claim-b: the MPS devices of this claim (gpu-0) overlap those "
        f"of claim team-a/claim-a ({UID_A}), whose MPS control daemon serves gpu-0, gpu-1: a device runs "
        "one MPS daemon, so claims using MPS on the same devices must use the same set"
    )
    assert list(state.prepared) == [UID_A]
    assert node.daemons.daemons() == [node.key("gpu-0", "gpu-1")]


def test_multi_user_starts_the_daemon_with_dash_m_and_a_claim_of_the_other_mode_cannot_join(
    node: Node,
) -> None:
    state = node.state()
    state.prepare(_share(UID_A, "gpu-0", SHARE_1, multiUser=True))
    key = node.key("gpu-0")
    pid = node.daemons.pid(key)
    assert pid is not None
    assert process_argv(pid)[-2:] == ["-d", "-M"]
    assert state.prepared[UID_A].devices[0].mps_multi_user
    with pytest.raises(ClaimError) as err:
        state.prepare(_share(UID_B, "gpu-0", SHARE_2))
    assert str(err.value) == (
        "cannot prepare ResourceClaim team-a/claim-b: the MPS control daemon of gpu-0 runs multi-user "
        f"for claim team-a/claim-a ({UID_A}); this claim asks multiUser: false, and one daemon runs in "
        "one mode"
    )
    state.prepare(_share(UID_B, "gpu-0", SHARE_2, multiUser=True))
    assert node.control_log(key).count("Starting control daemon") == 1
    # The mode survives a restart: the checkpoint records it.
    assert node.state().prepared[UID_B].devices[0].mps_multi_user


_PREPARE = """
import sys
from pathlib import Path
from tests.unit.test_mps import Node, _share, UID_A, SHARE_1
Node(Path(sys.argv[1])).state().prepare(_share(UID_A, "gpu-0", SHARE_1))
"""


def test_a_driver_killed_once_the_daemon_started_adopts_it_and_the_claim_converges(node: Node) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PREPARE, str(node.root)],
        env={**os.environ, "DRA_GPU_FAULT_POINT": "mps-daemon-started"},
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 137, done.stderr
    key = node.key("gpu-0")
    pid = node.daemons.pid(key)
    assert pid is not None
    # Recorded before the daemon started: the restarted driver adopts it, the retry answers.
    state = node.state()
    assert node.daemons.pid(key) == pid
    state.prepare(_share(UID_A, "gpu-0", SHARE_1))
    assert node.daemons.pid(key) == pid
    state.unprepare(UID_A)
    assert not _alive(pid)


_PREPARE_REFUSED = """
import sys
from pathlib import Path
from dra.model.allocation import ClaimError
from tests.unit.test_mps import Node, _claim, _mps, UID_A
state = Node(Path(sys.argv[1])).state()
try:
    state.prepare(_claim(UID_A, "gpu-0", config=_mps()))
except ClaimError as err:
    print(err)
print(sorted(state.prepared))
"""


@pytest.mark.skipif(
    shutil.which("setpriv") is None, reason=reason(Lack.TOOL, "needs util-linux setpriv to drop a capability")
)
def test_without_cap_sys_admin_the_claim_is_refused_naming_the_chart_value(node: Node) -> None:
    # The chart's container without kubeletPlugin.mps.enabled: root, CAP_SYS_ADMIN dropped.
    drop = ["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin"]
    done = subprocess.run(
        [*drop, sys.executable, "-c", _PREPARE_REFUSED, str(node.root)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    error, prepared = done.stdout.splitlines()
    assert error == (
        "cannot prepare ResourceClaim team-a/claim-a: cannot start the MPS control daemon: cannot make a "
        "mount namespace for the MPS control daemon: Operation not permitted; the MPS control daemon needs a "
        "mount namespace of its own, which takes CAP_SYS_ADMIN in the kubelet plugin's container "
        "(Helm chart: kubeletPlugin.mps.enabled=true)"
    )
    assert prepared == "[]"
    assert node.daemons.daemons() == []


def test_a_mig_device_gets_its_own_daemon_which_sees_the_mig_device_by_uuid(tmp_path: Path) -> None:
    node = Node(tmp_path, "h100x8-mig")
    mig = inventory("h100x8-mig").get("gpu-4-mig-1g10gb-3-0")
    assert mig is not None
    config = OpaqueConfig(
        "FromClaim",
        (),
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "4Gi"}},
        },
    )
    try:
        node.state().prepare(_claim(UID_A, mig.name, config=config))
        key = sharing.mps_key([mig.uuid])
        pid = node.daemons.pid(key)
        assert pid is not None
        assert daemon_devices(pid) == mig.uuid
        assert node.ask(key, "get_default_device_pinned_mem_limit 0") == "4G"
    finally:
        stop_mps_daemons(node.daemons)
        shutil.rmtree(node.daemons.root, ignore_errors=True)


REAL_MPS = Path(__file__).parents[1] / "data/real/h200-580/mps-control.txt"


def _recorded_dialogue() -> list[tuple[str, list[str]]]:
    """The real daemon's first session, up to its first CUDA client: each step and what it printed."""
    steps: list[tuple[str, list[str]]] = []
    for block in REAL_MPS.read_text().split("### ")[1:]:
        title, *lines = block.rstrip("\n").split("\n")
        if title == "a CUDA client":
            break
        if title.startswith(("client: ", "second -d", "client without daemon", "-d")):
            steps.append((title, lines))
    return steps


def test_the_fake_control_daemon_answers_what_the_real_one_did(tmp_path: Path) -> None:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "pipe"))
    env["CUDA_MPS_LOG_DIRECTORY"] = str(tmp_path / "log")

    def run(args: list[str], stdin: str = "") -> list[str]:
        done = subprocess.run(
            [*FAKE_MPS, *args], input=stdin, capture_output=True, text=True, env=env, timeout=10, check=False
        )
        return [*(done.stdout + done.stderr).splitlines(), f"rc={done.returncode}"]

    steps = _recorded_dialogue()
    assert len(steps) > 15
    try:
        for title, printed in steps:
            if title == "-d" or title == "second -d":
                got = run(["-d"])
                printed = printed[: printed.index(got[-1]) + 1]  # the recording lists files after
            elif title.startswith("client: "):
                got = run([], title.removeprefix("client: ") + "\n")
            else:
                continue
            assert got == printed, title
    finally:
        run([], "quit\n")
    # What quit leaves, as the real daemon left it.
    assert sorted(os.listdir(tmp_path / "pipe")) == sorted(fakemps.LEFT_AFTER_QUIT)


def test_a_limit_the_daemon_does_not_hold_refuses_the_claim(node: Node, tmp_path: Path) -> None:
    # A daemon that keeps its percentage whatever it is told, as the real one does with a value it rejects.
    stubborn = tmp_path / "stubborn-mps"
    stubborn.write_text(
        f"#!/bin/sh\n"
        f'[ "$#" -gt 0 ] && exec {" ".join(FAKE_MPS)} "$@"\n'
        f"read -r line\n"
        f'case "$line" in set_default_active_thread_percentage*) echo 100.0 ;;\n'
        f'  *) echo "$line" | {" ".join(FAKE_MPS)} ;; esac\n'
    )
    stubborn.chmod(0o755)
    node.daemons = MpsDaemons(node.daemons.root, [str(stubborn)])
    with pytest.raises(ClaimError) as err:
        node.state().prepare(_claim(UID_A, "gpu-0", config=_mps(defaultActiveThreadPercentage=50)))
    assert "did not take 'set_default_active_thread_percentage 50': it answered '100.0'" in str(err.value)


def test_a_daemon_that_exits_100_in_silence_is_said_to_lack_a_device(node: Node, tmp_path: Path) -> None:
    # The real daemon's way with a CUDA_VISIBLE_DEVICES entry it cannot find (tests/data/real/README.md).
    silent = tmp_path / "silent-mps"
    silent.write_text("#!/bin/sh\nexit 100\n")
    silent.chmod(0o755)
    node.daemons = MpsDaemons(node.daemons.root, [str(silent)])
    with pytest.raises(ClaimError) as err:
        node.state().prepare(_claim(UID_A, "gpu-0", config=_mps()))
    assert (
        f"exited with 100: no output, as when a device of CUDA_VISIBLE_DEVICES={_uuid('gpu-0')} is not"
        in str(err.value)
    )


def test_a_state_directory_too_long_for_the_daemons_sockets_is_refused_before_it_starts(node: Node) -> None:
    long_root = node.daemons.root / ("x" * 60)
    node.daemons = MpsDaemons(long_root, MPS_CONTROL)
    with pytest.raises(ClaimError) as err:
        node.state().prepare(_claim(UID_A, "gpu-0", config=_mps()))
    assert "control_privileged would be 1" in str(err.value)
    assert "over the 107 a Unix socket's path may have; give the plugin a shorter --state-dir" in str(
        err.value
    )
    assert not long_root.exists()


def test_a_daemon_that_fails_in_its_log_is_quoted_from_this_start_only(node: Node, tmp_path: Path) -> None:
    failing = tmp_path / "failing-mps"
    line = "[stamp Control 7] cannot open the GPU"
    failing.write_text(f'#!/bin/sh\necho "{line}" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"\nexit 1\n')
    failing.chmod(0o755)
    log = Path(node.dirs(node.key("gpu-0")).log) / "control.log"
    log.parent.mkdir(parents=True)
    log.write_text("[stamp Control 6] Exit with status 0\n")  # an earlier daemon's
    node.daemons = MpsDaemons(node.daemons.root, [str(failing)])
    with pytest.raises(ClaimError) as err:
        node.state().prepare(_claim(UID_A, "gpu-0", config=_mps()))
    assert str(err.value).endswith(
        "exited with 1: its control.log ends: [stamp Control 7] cannot open the GPU"
    )


@pytest.mark.parametrize(
    ("limit", "answer", "held"),
    [
        ("8192M", "8G", True),
        ("1536M", "1G", True),  # as the real daemon answered; its server applied 1536 MiB
        ("512M", "512M", True),
        ("512M", "0G", True),  # a unit the recording did not show for so small a limit: still held
        ("8192M", "4G", False),
        ("8192M", "", False),  # no limit
        ("8192M", "8192", False),
    ],
)
def test_a_limit_read_back_is_the_one_set_rounded_down_to_the_unit_of_the_answer(
    limit: str, answer: str, held: bool
) -> None:
    assert mpsdaemons._holds(limit, answer) is held
