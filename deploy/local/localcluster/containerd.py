"""The local cluster on a real runtime: containerd 2.x and runc (CONTAINER_RUNTIME=containerd).

containerd runs in the kubelet's private mount namespace (started by the same
shell, before the kubelet), so it sees the kubelet's volume mounts (service
account tokens are tmpfs mounts there) and its own mounts (overlayfs
snapshots, container root filesystems) stay out of the host's table. Its root,
state, socket and CNI state live in ``<run>/containerd``; it reads the CDI specs
from the run's CDI directory (``enable_cdi``, the 2.x default, with
``cdi_spec_dirs`` set), uses the cgroupfs driver as the kubelet does, the
overlayfs snapshotter, and the local pause image as the sandbox image
(localcluster.images). It also runs in the node's network namespace (localcluster.nodenet),
and pods get a network there from the ptp and host-local CNI plugins (a veth per pod,
addresses from the node's /24 of 10.88.0.0/16, a default route through the node): without
a CNI network containerd reports the network not ready and the kubelet keeps the node NotReady.

Besides the default handler ``runc`` there is ``nvidia-all``: runc with a base
OCI spec whose environment has ``NVIDIA_VISIBLE_DEVICES=all``, as NVIDIA's
container toolkit configures a node's default runtime (``--set-as-default``,
and the CUDA base images bake in the same value). A pod picks it with
``runtimeClassName: nvidia-all``; the e2e tests use it to show what such a node
leaks to a pod that asked for no GPU, and that the driver's specs override it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from localcluster.images import Image
from localcluster.nodenet import NodeNetwork

#: The RuntimeClass handler whose containers start with NVIDIA_VISIBLE_DEVICES=all.
LEAKY_HANDLER = "nvidia-all"


def layout(run: Path) -> dict[str, Path]:
    """The paths containerd uses inside a run directory."""
    base = run / "containerd"
    return {
        "base": base,
        "root": base / "root",
        "state": base / "state",
        "socket": base / "containerd.sock",
        "config": base / "config.toml",
        "cni_conf": base / "cni",
        "cni_state": base / "cni-state",
        "leaky_spec": base / "nvidia-all-spec.json",
    }


def _toml(value: object) -> str:
    # JSON strings and lists of strings are valid TOML.
    return json.dumps(value)


def write_config(run: Path, bins: Path, cdi_dir: str, sandbox: Image, net: NodeNetwork) -> Path:
    """Write containerd's config, the CNI network and the nvidia-all base spec; return the config path."""
    paths = layout(run)
    for key in ("root", "state", "cni_conf", "cni_state"):
        paths[key].mkdir(parents=True, exist_ok=True)
    base_spec = json.loads(
        subprocess.run([str(bins / "ctr"), "oci", "spec"], capture_output=True, check=True).stdout
    )
    base_spec["process"]["env"] = [*base_spec["process"].get("env", []), "NVIDIA_VISIBLE_DEVICES=all"]
    paths["leaky_spec"].write_text(json.dumps(base_spec, indent=2))
    (paths["cni_conf"] / "10-dra-gpu.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "dra-gpu-local",
                "plugins": [
                    {
                        "type": "ptp",
                        "ipMasq": False,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [
                                [
                                    {
                                        "subnet": net.pod_subnet,
                                        "rangeStart": net.pod_range[0],
                                        "rangeEnd": net.pod_range[1],
                                    }
                                ]
                            ],
                            # As on a real node; the node routes only to the machine's end of its link.
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(paths["cni_state"]),
                        },
                    },
                    {"type": "loopback"},
                ],
            },
            indent=2,
        )
    )
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    runtimes = f"{runtime}.containerd.runtimes"
    lines = [
        "version = 3",
        f"root = {_toml(str(paths['root']))}",
        f"state = {_toml(str(paths['state']))}",
        "[grpc]",
        f"  address = {_toml(str(paths['socket']))}",
        "[ttrpc]",
        f"  address = {_toml(str(paths['socket']) + '.ttrpc')}",
        "[plugins.'io.containerd.cri.v1.images']",
        "  snapshotter = 'overlayfs'",
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f"  sandbox = {_toml(sandbox.name)}",
        f"[{runtime}]",
        "  enable_cdi = true",
        # Processes here lack CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below ours, as
        # the kubelet asks for its sandboxes (-998); clamp instead of failing every pod.
        "  restrict_oom_score_adj = true",
        f"  cdi_spec_dirs = {_toml([cdi_dir])}",
        f"[{runtime}.cni]",
        f"  bin_dirs = {_toml([str(bins)])}",
        f"  conf_dir = {_toml(str(paths['cni_conf']))}",
        f"[{runtime}.containerd]",
        "  default_runtime_name = 'runc'",
    ]
    for handler, spec in (("runc", ""), (LEAKY_HANDLER, str(paths["leaky_spec"]))):
        lines += [
            f"[{runtimes}.'{handler}']",
            "  runtime_type = 'io.containerd.runc.v2'",
            f"  base_runtime_spec = {_toml(spec)}",
            f"[{runtimes}.'{handler}'.options]",
            f"  BinaryName = {_toml(str(bins / 'runc'))}",
            "  SystemdCgroup = false",
        ]
    paths["config"].write_text("\n".join(lines) + "\n")
    return paths["config"]


def start_commands(bins: Path, run: Path, images: list[Image]) -> list[str]:
    """Shell steps, for the kubelet's namespace set-up, that start containerd and import the images."""
    paths = layout(run)
    ctr = f"{bins / 'ctr'} --address {paths['socket']} -n k8s.io"
    wait = (
        f"i=0; until {ctr} version >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 300 ] || exit 1; sleep 0.1; done"
    )
    imports = [f"{ctr} images import --no-unpack=false {image.tarball} >/dev/null" for image in images]
    return [
        f'{{ PATH="{bins}:$PATH" {bins / "containerd"} --config {paths["config"]} '
        f'>>"{run / "logs" / "containerd.log"}" 2>&1 & }}',
        wait,
        *imports,
    ]


def import_image(bins: Path, run: Path, image: Image) -> None:
    """Import an image into the run's containerd while it runs (its socket is a file of the run)."""
    paths = layout(run)
    command = [str(bins / "ctr"), "--address", str(paths["socket"]), "-n", "k8s.io", "images", "import"]
    done = subprocess.run(
        [*command, "--no-unpack=false", str(image.tarball)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"ctr images import {image.tarball} failed: {done.stderr.strip()}")


def container_processes(container_id: str) -> list[int]:
    """The host PIDs of a running container's processes, its first process first.

    A container's cgroup is named after its ID (``/k8s.io/<id>``, as stop_leftovers relies on);
    `container_id` may carry the ``containerd://`` of a pod's container status.
    """
    wanted = container_id.removeprefix("containerd://")
    found: list[tuple[int, int]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroups = (entry / "cgroup").read_text().splitlines()
            # Field 22 of stat, after the command's closing parenthesis: the start time in ticks.
            started = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[19])
        except (OSError, IndexError, ValueError):
            continue
        if any(line.rsplit("/", 1)[-1] == wanted for line in cgroups):
            found.append((started, int(entry.name)))
    return [pid for _, pid in sorted(found)]


#: The lines of /proc/<pid>/status that say what a process may do.
PRIVILEGE_FIELDS = ("Uid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")


def privileges(pid: int) -> dict[str, str]:
    """The kernel's account of a process's privileges: the PRIVILEGE_FIELDS of /proc/<pid>/status."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in PRIVILEGE_FIELDS:
            fields[name] = value.strip()
    return fields


def stop_leftovers(run: Path) -> list[int]:
    """SIGKILL the containers and shims of this run's containerd; return their PIDs.

    The runc shim leaves containerd's process group (it must outlive a containerd restart)
    and a container's processes are the shim's children, so stopping the kubelet's group
    leaves both running. They are found by what ties them to this run: a container's cgroup
    is named after its ID (``/k8s.io/<id>``), which has a task directory in this run's
    state; a shim's command line names this run's containerd socket.
    """
    paths = layout(run)
    tasks = paths["state"] / "io.containerd.runtime.v2.task" / "k8s.io"
    ids = {entry.name for entry in tasks.iterdir()} if tasks.is_dir() else set()
    socket_path = str(paths["socket"])
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cgroups = (entry / "cgroup").read_text().splitlines()
        except OSError:
            continue
        in_container = any(line.rsplit("/", 1)[-1] in ids for line in cgroups)
        if in_container or socket_path in cmdline:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed.append(int(entry.name))
    return killed
