"""Benchmark: runc starting a container with dra-gpu's claim-spec edits and NVIDIA's, one change at a time.

    sudo PYTHONPATH=deploy/local .venv/bin/python -m tests.bench.bench_cdihooks [--rounds 20]

`make bench-pods` on containerd times StartContainer per driver; the one part of it a CDI spec
decides is runc's create with the spec's mounts and createContainer hooks. dra-gpu's claim spec and
NVIDIA's gpu-kubelet-plugin's (both captured from that benchmark, v1.19 hook) run the same four
`nvidia-cdi-hook` hooks over the same three driver files; they differ in the library folder of each
fake node (`/usr/lib/x86_64-linux-gnu` against `/usr/lib64`, given to create-symlinks and
update-ldcache), the mount options (dra.core.cdi.DRIVER_FILE_OPTIONS against NVIDIA's `rbind`,
`rprivate`) and dra-gpu's four DRA_GPU_* variables per device. Each variant below swaps one of
them; `no hooks` is the floor (mounts and variables only). The edits are dra.core.cdi's own
(driver_hooks, the options), turned into an OCI config the way containerd's CDI injection does,
over the busybox image's root; device nodes are left out (both specs have the same ones, and a
fake node's need mknod). Per variant, in turns (each round starting one further): `runc run` of
`/bin/true` (create, the hooks, start, exit), its CPU (runc, the hooks and the container, user +
system: steadier than the wall on a loaded machine), and each hook's own wall time (a wrapper
around the hook logs it). Needs root. Prints p50 and the range; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from fakenvml.fakecuda import ensure_fake_cuda
from fakenvml.library import ensure_library
from localcluster.binaries import ensure_containerd_binaries, ensure_nvidia_cdi_hook
from localcluster.images import busybox_image

from dra.core.cdi import DRIVER_FILE_OPTIONS, driver_hooks, env_key
from dra.model.devices import ContainerHook, DriverFile

VERSION = "550.54.15"
OURS_DIR, NVIDIA_DIR = "/usr/lib/x86_64-linux-gnu", "/usr/lib64"
NVIDIA_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
#: (label, library folder, mount options, DRA_GPU_* variables, hooks)
VARIANTS = (
    ("dra-gpu", OURS_DIR, DRIVER_FILE_OPTIONS, True, True),
    ("nvidia", NVIDIA_DIR, NVIDIA_OPTIONS, False, True),
    ("dra-gpu, /usr/lib64", NVIDIA_DIR, DRIVER_FILE_OPTIONS, True, True),
    ("dra-gpu, rbind rprivate", OURS_DIR, NVIDIA_OPTIONS, True, True),
    ("dra-gpu, no DRA_GPU_*", OURS_DIR, DRIVER_FILE_OPTIONS, False, True),
    ("no hooks", OURS_DIR, DRIVER_FILE_OPTIONS, True, False),
)
#: Logs each hook's wall time: the hook is given state on stdin by runc, passed through.
WRAPPER = """#!/bin/sh
s=$(date +%s%N)
"$BENCH_HOOK" "$@"; rc=$?
echo "$BENCH_VARIANT $1 $(( ($(date +%s%N) - s) / 1000 ))" >> "$BENCH_LOG"
exit $rc
"""


def _node(root: Path, folder: str) -> list[DriverFile]:
    """A driver root with libcuda, libnvidia-ml (the fake ELF objects) and nvidia-smi under `folder`."""
    sources = {
        f"{folder}/libcuda.so.{VERSION}": ensure_fake_cuda(log=False),
        f"{folder}/libnvidia-ml.so.{VERSION}": ensure_library(log=False),
        "/usr/bin/nvidia-smi": Path("/bin/true"),
    }
    files = []
    for path, source in sources.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
        files.append(DriverFile(str(target), path, "binary" if path.endswith("smi") else "library"))
    for name in ("libcuda.so", "libnvidia-ml.so"):
        files.append(
            DriverFile(str(root / folder.lstrip("/") / f"{name}.{VERSION}"), f"{folder}/{name}.1", "library")
        )
    return files


def _config(
    base: dict[str, Any], work: Path, variant: tuple[str, str, tuple[str, ...], bool, bool]
) -> dict[str, Any]:
    _, folder, options, dra_env, hooks = variant
    files = _node(work / f"node{folder.replace('/', '_')}", folder)
    config: dict[str, Any] = json.loads(json.dumps(base))
    process = config["process"]
    process.update(terminal=False, args=["/bin/true"])
    config["root"]["readonly"] = False
    # The SONAME links are the hook's to make (create-symlinks), not mounts: as in both specs.
    mounts = [
        f for f in files if f.kind != "library" or f.host_path.endswith(f.container_path.rsplit("/", 1)[1])
    ]
    config["mounts"] += [
        {"destination": f.container_path, "type": "bind", "source": f.host_path, "options": list(options)}
        for f in mounts
    ]
    process["env"] += ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={folder}"]
    if dra_env:
        key = env_key("gpu-0")
        process["env"] += [
            f"{key}_NAME=gpu-0",
            f"{key}_UUID=GPU-0",
            f"{key}_PRODUCT=NVIDIA H100",
            "DRA_GPU_CLAIM_X=x",
        ]
    if hooks:
        hook = ContainerHook(str(work / "wrap" / "nvidia-cdi-hook"), VERSION)
        created = []
        for entry in driver_hooks(files, hook):
            env = [
                *entry["env"],
                f"BENCH_HOOK={work / 'nvidia-cdi-hook'}",
                f"BENCH_VARIANT={VARIANTS.index(variant)}",
            ]
            created.append(
                {
                    "path": entry["path"],
                    "args": entry["args"],
                    "env": [*env, f"BENCH_LOG={work / 'hooks.log'}"],
                }
            )
        config["hooks"] = {"createContainer": created}
    return config


def _rootfs(target: Path) -> None:
    with tarfile.open(busybox_image().tarball) as oci:
        index = json.load(oci.extractfile("index.json"))  # type: ignore[arg-type]
        manifest_digest = index["manifests"][0]["digest"].split(":")[1]
        manifest = json.load(oci.extractfile(f"blobs/sha256/{manifest_digest}"))  # type: ignore[arg-type]
        for layer in manifest["layers"]:
            blob = oci.extractfile(f"blobs/sha256/{layer['digest'].split(':')[1]}")
            with tarfile.open(fileobj=blob) as tar:
                tar.extractall(target, filter="tar")


def _children_cpu() -> float:
    """CPU seconds of this process's waited-for descendants: runc, its hooks, the container."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _p50(samples: list[float]) -> str:
    return f"{statistics.median(samples):6.1f} ({min(samples):.1f} to {max(samples):.1f})"


def main() -> None:
    """Build the variants' bundles, run them in turns, print each one's runc run and hook times."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="containers per variant")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_cdihooks: runc needs root")
    runc = ensure_containerd_binaries() / "runc"
    with tempfile.TemporaryDirectory(prefix="bench-cdihooks-") as tmp:
        work = Path(tmp)
        shutil.copy(ensure_nvidia_cdi_hook(), work / "nvidia-cdi-hook")
        # The wrapper under the hook's own name: the hooks' argv[0] is as in the specs.
        (work / "wrap").mkdir()
        (work / "wrap" / "nvidia-cdi-hook").write_text(WRAPPER)
        (work / "wrap" / "nvidia-cdi-hook").chmod(0o755)
        _rootfs(work / "rootfs")
        subprocess.run([str(runc), "spec", "--bundle", str(work)], check=True)
        base = json.loads((work / "config.json").read_text())
        runs: dict[str, list[float]] = defaultdict(list)
        cpu: dict[str, list[float]] = defaultdict(list)
        for number in range(args.rounds):
            # Each round starts at the next variant: no variant always follows the same one.
            for variant in VARIANTS[number % len(VARIANTS) :] + VARIANTS[: number % len(VARIANTS)]:
                label = variant[0]
                bundle = work / f"bundle-{number}-{VARIANTS.index(variant)}"
                bundle.mkdir()
                shutil.copytree(work / "rootfs", bundle / "rootfs", symlinks=True)
                (bundle / "config.json").write_text(json.dumps(_config(base, work, variant)))
                name = f"bench-cdihooks-{os.getpid()}-{VARIANTS.index(variant)}"
                start, used = time.perf_counter(), _children_cpu()
                ran = subprocess.run(
                    [str(runc), "run", "--bundle", str(bundle), name], capture_output=True, text=True
                )
                runs[label].append((time.perf_counter() - start) * 1000)
                cpu[label].append((_children_cpu() - used) * 1000)
                subprocess.run([str(runc), "delete", "--force", name], capture_output=True, check=False)
                if ran.returncode != 0:
                    raise SystemExit(f"bench_cdihooks: runc run of {label!r} failed: {ran.stderr.strip()}")
                shutil.rmtree(bundle)
        hooks: dict[tuple[str, str], list[float]] = defaultdict(list)
        for line in (work / "hooks.log").read_text().splitlines():
            index, hook, micros = line.split()
            hooks[(VARIANTS[int(index)][0], hook)].append(int(micros) / 1000)
    print(f"runc run of /bin/true with each variant's edits, {args.rounds} in turns; ms p50 (range)")
    hook_names = list(dict.fromkeys(hook for _, hook in hooks))
    print(f"| variant | runc run | its CPU | {' | '.join(hook_names)} |")
    print("|---" * (3 + len(hook_names)) + "|")
    for label, *_ in VARIANTS:
        cells = [_p50(hooks[(label, hook)]) if hooks.get((label, hook)) else "-" for hook in hook_names]
        print(f"| {label} | {_p50(runs[label])} | {_p50(cpu[label])} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
