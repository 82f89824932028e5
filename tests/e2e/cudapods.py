"""Pods of CUDA workload images (localcluster.cudaimages) on a containerd cluster, and what each saw.

A container of the ``debian`` image records, as a workload finds its driver: `/sbin/ldconfig -p`,
where libcuda.so.1 and libcuda.so lead in each folder the cache lists libcuda.so.1 in, cudaprobe's
report (the libraries the loader mapped by SONAME, the devices CUDA enumerates), `nvidia-smi -L`,
its environment and device nodes. A ``distroless`` container has no shell: cudaprobe alone
writes its report. Both write into a hostPath directory (localcluster.workloads.out_dir).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster.cluster import ClusterInfo
from localcluster.cudaimages import PROBE
from localcluster.kube import Kube, wait_for
from localcluster.workloads import out_dir

#: The debian container's record; `cudaprobe` last but one, so that a failing probe still leaves the rest.
DEBIAN_REPORT = (
    'o=/out/"$C"; /sbin/ldconfig -p > "$o.ldconfig" 2>&1; '
    "for f in $(/sbin/ldconfig -p | sed -n 's/.*libcuda[.]so[.]1 .*=> //p'); do d=\"${f%/*}\"; "
    'for l in "$d/libcuda.so.1" "$d/libcuda.so"; do [ -e "$l" ] && echo "$l $(readlink -f "$l")"; done; '
    'done > "$o.links"; '
    'nvidia-smi -L > "$o.smi" 2>&1; env > "$o.env"; '
    'for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c "$f" ] && echo "$f"; done > "$o.dev"; '
    f'{PROBE["debian"]} "$o.probe"; echo $? > "$o.rc"; touch "$o.done"; exec sleep 3600'
)


@dataclass
class CudaSeen:
    """What one container of a CUDA workload image saw."""

    kind: str
    #: cudaprobe's report, `key: value` (libcuda.so.1, libnvidia-ml.so.1, cuInit, ...).
    probe: dict[str, str]
    #: The devices CUDA enumerated: (UUID, total memory, name), in ordinal order.
    devices: list[tuple[str, int, str]]
    #: The lines of `ldconfig -p` (debian only).
    ldconfig: list[str] = field(default_factory=list)
    #: For each folder where the cache lists libcuda.so.1: that link and libcuda.so, resolved.
    links: dict[str, str] = field(default_factory=dict)
    smi: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    dev: list[str] = field(default_factory=list)

    def cache(self, soname: str) -> list[str]:
        """The paths `ldconfig -p` gives for a library name, e.g. libcuda.so.1."""
        return [line.split(" => ")[-1] for line in self.ldconfig if line.strip().startswith(soname + " ")]


def cuda_pod(
    kube: Kube,
    cluster: ClusterInfo,
    namespace: str,
    name: str,
    containers: dict[str, tuple[str, str, dict[str, Any]]],
    claims: dict[str, str] | None = None,
) -> None:
    """A pod whose containers run CUDA workload images: `containers` maps a name to (kind, image,
    resources); `claims` maps a pod claim name to its ResourceClaimTemplate."""
    out = out_dir(cluster, namespace, name)
    out.mkdir(parents=True, exist_ok=True)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "volumes": [{"name": "out", "hostPath": {"path": str(out)}}],
        "containers": [
            {
                "name": container,
                "image": image,
                "command": ["sh", "-c", DEBIAN_REPORT]
                if kind == "debian"
                else [PROBE[kind], f"/out/{container}.probe"],
                "env": [{"name": "C", "value": container}],
                "volumeMounts": [{"name": "out", "mountPath": "/out"}],
                "resources": resources,
            }
            for container, (kind, image, resources) in containers.items()
        ],
    }
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimTemplateName": t} for c, t in claims.items()]
    kube.create(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    )


def _terminated(kube: Kube, namespace: str, pod: str, container: str) -> bool:
    status = kube.get("v1", "Pod", pod, namespace).get("status") or {}
    for found in status.get("containerStatuses") or []:
        if found["name"] == container and "terminated" in (found.get("state") or {}):
            return True
    return False


def cuda_seen(
    kube: Kube, cluster: ClusterInfo, namespace: str, pod: str, container: str, kind: str
) -> CudaSeen:
    """What a container of a cuda_pod recorded, once it has."""
    out = out_dir(cluster, namespace, pod)
    if kind == "debian":
        done = (out / f"{container}.done").exists
    else:

        def done() -> bool:
            return _terminated(kube, namespace, pod, container)

    wait_for(f"{pod}/{container} to record what it sees", done, timeout=120)
    probe_lines = _read(out / f"{container}.probe")
    probe = dict(
        line.split(": ", 1) for line in probe_lines if ": " in line and not line.startswith("device ")
    )
    devices = []
    for line in probe_lines:
        match = re.match(r"device \d+: (\S+) (\d+) (.*)$", line)
        if match:
            devices.append((match[1], int(match[2]), match[3]))
    seen = CudaSeen(kind, probe, devices)
    if kind == "debian":
        seen.ldconfig = _read(out / f"{container}.ldconfig")
        seen.links = dict(line.split(" ", 1) for line in _read(out / f"{container}.links"))
        seen.smi = _read(out / f"{container}.smi")
        seen.env = dict(line.split("=", 1) for line in _read(out / f"{container}.env") if "=" in line)
        seen.dev = sorted(_read(out / f"{container}.dev"))
    return seen


def _read(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def triton_libcuda_dirs(ldconfig: list[str], exists: set[str]) -> list[str]:
    """Where Triton's NVIDIA backend finds libcuda (triton/backends/nvidia/driver.py, libcuda_dirs):
    the folders of the `ldconfig -p` lines naming libcuda.so.1; it fails ("libcuda.so cannot found!")
    unless libcuda.so.1 is in one of them (`exists`: the paths the container has), then links -lcuda."""
    locations = [line.split()[-1] for line in ldconfig if "libcuda.so.1" in line]
    folders = [os.path.dirname(location) for location in locations]
    if not any(f"{folder}/libcuda.so.1" in exists for folder in folders):
        raise AssertionError(f"libcuda.so cannot found! (ldconfig -p: {locations})")
    return folders
