"""Usage per claim over time: the fake GPUs' processes change, the series follow them.

Each test drives fake processes (dra.fakegpus.processes) on fake GPUs, in pods whose cgroups a
fake /proc tree gives, and checks relations between what the processes declared and what
the sampler publishes over successive samples, not constants.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from dra.core.devicestatus import Consumer, DeviceIdentity, identities
from dra.core.usage import container_of
from dra.daemon import metrics
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.processes import FakeProcess, parse_processes
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.gpu.library import ERROR_NOT_FOUND, ERROR_NOT_SUPPORTED, GpuLibraryError
from dra.kubeletplugin.usage import ProcessOwners, UsageSampler
from dra.model.devices import Gpu, MigDevice
from dra.model.prepared import PreparedClaim, PreparedDevice
from tests.unit.helpers import DRIVER, NODE

MiB = 1024 * 1024
INTERVAL = 10.0


class Node:
    """Fake GPUs, a fake /proc, the node's pods and claims, and a sampler over them with one clock."""

    def __init__(self, tmp_path: Path, profile: str = "h100x8", processes: bool = True, cap: int = 100):
        self.now = 1000.0
        self.lib = FakeGpuLibrary(load_profile(profile), NODE)
        self.lib.processes.clock = lambda: self.now
        self.inventory = discover(self.lib)
        self.proc = tmp_path / "proc"
        self.pods: list[dict[str, Any]] = []
        self.running: list[FakeProcess] = []
        self.claims: dict[str, tuple[PreparedClaim, tuple[DeviceIdentity, ...]]] = {}
        self.consumers: list[Consumer] = []
        self.listings = 0
        owners = ProcessOwners(self.proc, self._list_pods) if processes else None
        self.sampler = UsageSampler(self.lib, owners, cap, clock=lambda: self.now)

    async def _list_pods(self) -> list[dict[str, Any]]:
        self.listings += 1
        return self.pods

    def pod(self, name: str, *containers: str, namespace: str = "team-a") -> dict[str, str]:
        """A running pod; container name -> container ID."""
        uid = str(uuidlib.uuid4())
        ids = {c: uuidlib.uuid4().hex + uuidlib.uuid4().hex for c in containers}
        self.pods.append(
            {
                "metadata": {"namespace": namespace, "name": name, "uid": uid},
                "status": {
                    "containerStatuses": [
                        {"name": c, "containerID": f"containerd://{i}"} for c, i in ids.items()
                    ]
                },
            }
        )
        return {"uid": uid, **ids}

    def claim(
        self, name: str, device: Gpu | MigDevice, *users: tuple[str, str], namespace: str = "team-a"
    ) -> None:
        """A prepared claim of one device, used by (pod, container) of `users`."""
        entry = PreparedDevice(("gpu",), NODE, device.name, (f"k8s.{DRIVER}/claim={name}",), uuid=device.uuid)
        prepared = PreparedClaim(f"uid-{name}", namespace, name, (entry,))
        self.claims[prepared.uid] = (prepared, identities(prepared, self.inventory))
        for pod, container in users:
            self.consumers.append(Consumer(namespace, pod, container, namespace, name, device.name))

    def run(self, pid: int, device: Gpu | MigDevice, memory: int, duty: float, cgroup: str) -> None:
        """Start (or change) a process in a cgroup."""
        (self.proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (self.proc / str(pid) / "cgroup").write_text(cgroup)
        self.running = [p for p in self.running if p.pid != pid] + [
            FakeProcess(pid, device.uuid, memory, duty)
        ]
        self.lib.processes.set(self.running)

    def end(self, pid: int) -> None:
        """The process exits."""
        self.running = [p for p in self.running if p.pid != pid]
        self.lib.processes.set(self.running)

    def sample(self, after: float = INTERVAL) -> None:
        """Let `after` seconds pass, then sample."""
        self.now += after
        anyio.run(self.sampler.sample, self.inventory, self.claims, self.consumers)


def in_pod(pod: dict[str, str], container: str) -> str:
    """/proc/<pid>/cgroup of a container under the systemd cgroup driver and containerd (cgroup v2)."""
    slice_uid = pod["uid"].replace("-", "_")
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{slice_uid}.slice/cri-containerd-{pod[container]}.scope\n"
    )


def value(name: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels)


def claim_labels(
    node: Node, claim: str, device: Gpu | MigDevice, pod: str = "", container: str = ""
) -> dict[str, str]:
    gpu_uuid, gi = (
        (device.parent.uuid, str(device.gpu_instance_id))
        if isinstance(device, MigDevice)
        else (device.uuid, "")
    )
    return {
        "UUID": gpu_uuid,
        "GPU_I_ID": gi,
        "dra_claim_namespace": "team-a",
        "dra_claim_name": claim,
        "dra_device_name": device.name,
        "namespace": "team-a" if pod else "",
        "pod": pod,
        "container": container,
    }


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    made = Node(tmp_path)
    yield made
    made.sampler.close()


def test_utilisation_follows_a_duty_change_within_one_interval(node: Node) -> None:
    gpu = node.inventory.gpus[0]
    pod = node.pod("train", "main")
    node.claim("exclusive", gpu, ("train", "main"))
    labels = claim_labels(node, "exclusive", gpu, "train", "main")
    seen = []
    for duty in (0.3, 0.3, 0.8, 0.8, 0.1):
        node.run(100, gpu, 2048 * MiB, duty, in_pod(pod, "main"))
        node.sample()
        seen.append(value("dra_gpu_claim_utilization_ratio", **labels))
    assert seen == pytest.approx([0.3, 0.3, 0.8, 0.8, 0.1], abs=0.01)


def test_two_claims_on_one_gpu_read_their_own_duties_and_memory_exactly(node: Node) -> None:
    gpu = node.inventory.gpus[1]
    a, b = node.pod("a", "main"), node.pod("b", "main")
    node.claim("share-a", gpu, ("a", "main"))
    node.claim("share-b", gpu, ("b", "main"))
    node.run(200, gpu, 3000 * MiB + 17, 0.6, in_pod(a, "main"))
    node.run(201, gpu, 1000 * MiB + 3, 0.2, in_pod(b, "main"))
    node.sample()
    assert value("dra_gpu_claim_utilization_ratio", **claim_labels(node, "share-a", gpu, "a", "main")) == (
        pytest.approx(0.6, abs=0.05)
    )
    assert value("dra_gpu_claim_utilization_ratio", **claim_labels(node, "share-b", gpu, "b", "main")) == (
        pytest.approx(0.2, abs=0.05)
    )
    assert value("dra_gpu_claim_memory_used_bytes", **claim_labels(node, "share-a", gpu, "a", "main")) == (
        3000 * MiB + 17
    )
    assert value("dra_gpu_claim_memory_used_bytes", **claim_labels(node, "share-b", gpu, "b", "main")) == (
        1000 * MiB + 3
    )


def test_busy_seconds_track_duty_times_time(node: Node) -> None:
    gpu = node.inventory.gpus[2]
    pod = node.pod("batch", "main")
    node.claim("chargeback", gpu, ("batch", "main"))
    labels = claim_labels(node, "chargeback", gpu, "batch", "main")
    node.run(300, gpu, MiB, 0.5, in_pod(pod, "main"))
    node.sample()
    start = value("dra_gpu_claim_busy_seconds_total", **labels) or 0.0
    expected = 0.0
    for duty, seconds in ((0.5, 10.0), (0.5, 20.0), (0.25, 10.0), (1.0, 5.0), (0.0, 30.0)):
        node.run(300, gpu, MiB, duty, in_pod(pod, "main"))
        node.sample(seconds)
        expected += duty * seconds
    assert (value("dra_gpu_claim_busy_seconds_total", **labels) or 0.0) - start == pytest.approx(
        expected, rel=0.02
    )


def test_memory_of_an_ended_process_is_gone_at_the_next_sample(node: Node) -> None:
    gpu = node.inventory.gpus[3]
    pod = node.pod("serve", "main", "sidecar")
    node.claim("serving", gpu, ("serve", "main"), ("serve", "sidecar"))
    node.run(400, gpu, 500 * MiB, 0.4, in_pod(pod, "main"))
    node.run(401, gpu, 700 * MiB, 0.1, in_pod(pod, "sidecar"))
    node.sample()
    main, sidecar = (claim_labels(node, "serving", gpu, "serve", c) for c in ("main", "sidecar"))
    assert value("dra_gpu_claim_memory_used_bytes", **main) == 500 * MiB
    assert value("dra_gpu_claim_memory_used_bytes", **sidecar) == 700 * MiB
    node.end(401)
    node.sample()
    assert value("dra_gpu_claim_memory_used_bytes", **sidecar) == 0
    assert value("dra_gpu_claim_utilization_ratio", **sidecar) == 0
    assert value("dra_gpu_claim_memory_used_bytes", **main) == 500 * MiB


def test_claims_and_unattributed_use_add_up_to_the_device(node: Node) -> None:
    gpu = node.inventory.gpus[4]
    owner, intruder = node.pod("owner", "main"), node.pod("no-claim", "main")
    node.claim("owned", gpu, ("owner", "main"))
    node.run(500, gpu, 1000 * MiB, 0.3, in_pod(owner, "main"))
    # A pod without the claim and a host process: never the claim's.
    node.run(501, gpu, 400 * MiB, 0.2, in_pod(intruder, "main"))
    node.run(502, gpu, 100 * MiB, 0.1, "0::/system.slice/nvidia-persistenced.service\n")
    for _ in range(3):
        node.sample()
        mine = claim_labels(node, "owned", gpu, "owner", "main")
        device = {"UUID": gpu.uuid, "GPU_I_ID": ""}
        claimed = value("dra_gpu_claim_memory_used_bytes", **mine)
        stray = value("dra_gpu_unattributed_memory_used_bytes", **device)
        assert claimed == 1000 * MiB
        assert stray == 500 * MiB
        assert (claimed or 0) + (stray or 0) == node.lib.memory_used(node.lib.device_by_index(gpu.index))
        busy = (value("dra_gpu_claim_utilization_ratio", **mine) or 0) + (
            value("dra_gpu_unattributed_utilization_ratio", **device) or 0
        )
        assert busy == pytest.approx(
            node.lib.utilization(node.lib.device_by_index(gpu.index)) / 100, abs=0.01
        )
        node.run(500, gpu, 1000 * MiB, 0.5, in_pod(owner, "main"))


def test_the_node_s_pods_are_listed_again_only_for_a_container_not_seen_before(node: Node) -> None:
    gpu = node.inventory.gpus[7]
    first = node.pod("first", "main")
    node.claim("first", gpu, ("first", "main"))
    node.run(550, gpu, 10 * MiB, 0.1, in_pod(first, "main"))
    node.sample()
    # A container no pod has (a runtime's own, docker run on the node): never anyone's, listed once.
    node.run(551, gpu, 20 * MiB, 0.1, f"0::/system.slice/docker-{'b' * 64}.scope\n")
    for _ in range(3):
        node.sample()
    assert node.listings == 2
    assert value("dra_gpu_unattributed_memory_used_bytes", UUID=gpu.uuid, GPU_I_ID="") == 20 * MiB
    late = node.pod("late", "main")
    node.claim("late", gpu, ("late", "main"))
    node.run(552, gpu, 30 * MiB, 0.1, in_pod(late, "main"))
    node.sample()
    assert node.listings == 3
    assert (
        value("dra_gpu_claim_memory_used_bytes", **claim_labels(node, "late", gpu, "late", "main"))
        == 30 * MiB
    )


def test_without_per_process_attribution_a_shared_gpu_is_credited_to_no_claim(tmp_path: Path) -> None:
    node = Node(tmp_path, processes=False)
    shared, alone = node.inventory.gpus[5], node.inventory.gpus[6]
    node.claim("share-a", shared)
    node.claim("share-b", shared)
    node.claim("alone", alone)
    node.run(600, shared, 800 * MiB, 0.5, "")
    node.run(601, alone, 900 * MiB, 0.7, "")
    node.sample()
    assert value("dra_gpu_claim_memory_used_bytes", **claim_labels(node, "share-a", shared)) is None
    assert value("dra_gpu_unattributed_memory_used_bytes", UUID=shared.uuid, GPU_I_ID="") is None
    assert value("dra_gpu_claim_memory_used_bytes", **claim_labels(node, "alone", alone)) == 900 * MiB
    assert value("dra_gpu_claim_utilization_ratio", **claim_labels(node, "alone", alone)) == pytest.approx(
        0.7
    )
    node.sampler.close()


def test_series_beyond_the_cap_are_dropped_and_counted(tmp_path: Path) -> None:
    node = Node(tmp_path, processes=False, cap=3)
    for index, gpu in enumerate(node.inventory.gpus[:5]):
        node.claim(f"capped-{index}", gpu)
    before = value("dra_gpu_usage_series_dropped_total") or 0.0
    node.sample()
    kept = [
        i
        for i, gpu in enumerate(node.inventory.gpus[:5])
        if value("dra_gpu_claim_memory_used_bytes", **claim_labels(node, f"capped-{i}", gpu)) is not None
    ]
    assert len(kept) == 3
    assert (value("dra_gpu_usage_series_dropped_total") or 0.0) - before == 2
    assert (value("dra_gpu_usage_sample_duration_seconds_count") or 0) > 0
    node.sampler.close()


def _mig(node: Node) -> MigDevice:
    return next(d for d in node.inventory.devices if isinstance(d, MigDevice))


def test_a_mig_device_s_utilisation_comes_from_gpm_on_hopper(tmp_path: Path) -> None:
    node = Node(tmp_path, "h100x8-mig")
    mig = _mig(node)
    pod = node.pod("mig", "main")
    node.claim("slice", mig, ("mig", "main"))
    labels = claim_labels(node, "slice", mig, "mig", "main")
    node.run(700, mig, 2000 * MiB, 0.4, in_pod(pod, "main"))
    node.sample()
    # GPM needs two samples: the first has no utilisation, absent rather than 0.
    assert value("dra_gpu_claim_utilization_ratio", **labels) is None
    assert value("dra_gpu_claim_memory_used_bytes", **labels) == 2000 * MiB
    node.sample()
    assert value("dra_gpu_claim_utilization_ratio", **labels) == pytest.approx(0.4, abs=0.01)
    node.run(700, mig, 2000 * MiB, 0.9, in_pod(pod, "main"))
    node.sample()
    assert value("dra_gpu_claim_utilization_ratio", **labels) == pytest.approx(0.9, abs=0.01)
    node.sampler.close()


def test_a_mig_device_without_gpm_has_no_utilisation_series(tmp_path: Path) -> None:
    node = Node(tmp_path, "a100x4-mig")
    mig = _mig(node)
    pod = node.pod("mig", "main")
    node.claim("ampere", mig, ("mig", "main"))
    labels = claim_labels(node, "ampere", mig, "mig", "main")
    node.run(800, mig, 1234 * MiB, 0.5, in_pod(pod, "main"))
    node.sample()
    node.sample()
    assert value("dra_gpu_claim_memory_used_bytes", **labels) == 1234 * MiB
    assert value("dra_gpu_claim_utilization_ratio", **labels) is None
    assert (
        value(
            "dra_gpu_unattributed_utilization_ratio", UUID=mig.parent.uuid, GPU_I_ID=str(mig.gpu_instance_id)
        )
        is None
    )
    node.sampler.close()


def test_the_fake_answers_as_nvml_does(tmp_path: Path) -> None:
    node = Node(tmp_path, "a100x4-mig")
    mig = _mig(node)
    parent = node.lib.device_by_index(mig.parent.index)
    with pytest.raises(GpuLibraryError) as err:
        node.lib.utilization(parent)
    assert err.value.code == ERROR_NOT_SUPPORTED
    with pytest.raises(GpuLibraryError) as err:
        node.lib.gpm_sample(parent, None)
    assert err.value.code == ERROR_NOT_SUPPORTED
    whole = Node(tmp_path, "h100x8")
    gpu = whole.lib.device_by_index(0)
    whole.run(900, whole.inventory.gpus[0], MiB, 0.0, "")
    with pytest.raises(GpuLibraryError) as err:
        whole.lib.process_utilization(gpu, 0)
    assert err.value.code == ERROR_NOT_FOUND  # an idle process: no sample
    whole.run(900, whole.inventory.gpus[0], MiB, 0.5, "")
    [sample] = whole.lib.process_utilization(gpu, 0)
    assert (sample.pid, sample.sm_percent) == (900, 50)


def test_the_control_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    control = tmp_path / "processes.json"
    lib = FakeGpuLibrary(load_profile("h100x8"), NODE, processes=control)
    gpu = lib.device_by_index(0)
    assert lib.memory_used(gpu) == 0
    control.write_text(
        f'{{"processes": [{{"pid": 7, "device": "{lib.uuid(gpu)}", "memory": 42, "duty": 0.25}}]}}'
    )
    assert (lib.memory_used(gpu), lib.utilization(gpu)) == (42, 25)
    control.write_text('{"processes": []}')
    assert lib.memory_used(gpu) == 0
    control.write_text('{"processes": [{"pid": 7, "device": "x", "memory": 1, "duty": 2}]}')
    with pytest.raises(GpuLibraryError, match=r"processes\[0\]\.duty: expected a fraction from 0 to 1"):
        lib.memory_used(gpu)


@pytest.mark.parametrize(
    "bad",
    [[], {"processes": [{"pid": 0, "device": "GPU-x", "memory": 1, "duty": 0}]}, {"processes": [5]}],
)
def test_a_bad_control_file_says_what_is_wrong(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^control: "):
        parse_processes(bad, "control")


POD_UID = "0f4c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
SLICE_UID = POD_UID.replace("-", "_")
CID = "a" * 64


@pytest.mark.parametrize(
    "cgroup",
    [
        # cgroup v2, systemd driver, containerd
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SLICE_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        # cgroup v2, cgroupfs driver
        f"0::/kubepods/burstable/pod{POD_UID}/{CID}\n",
        # cgroup v1, cgroupfs driver, one line per hierarchy
        f"12:pids:/kubepods/pod{POD_UID}/{CID}\n11:memory:/kubepods/pod{POD_UID}/{CID}\n",
        # kind: the kubelet's cgroups under the node container's kubelet.slice
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{SLICE_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        # containerd's namespace path, the kubelet making no pod cgroups (the local cluster's)
        f"9:name=systemd:/k8s.io/{CID}\n0::/k8s.io/{CID}\n",
        # CRI-O
        f"0::/kubepods.slice/kubepods-pod{SLICE_UID}.slice/crio-{CID}.scope\n",
    ],
)
def test_a_container_s_cgroup_names_its_container(cgroup: str) -> None:
    assert container_of(cgroup) == CID


@pytest.mark.parametrize(
    "cgroup",
    ["0::/system.slice/sshd.service\n", "0::/user.slice/user-0.slice/session-1.scope\n", "", "0::/\n"],
)
def test_a_process_in_no_pod_has_no_container(cgroup: str) -> None:
    assert container_of(cgroup) is None
