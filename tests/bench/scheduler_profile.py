"""kube-scheduler's own CPU profile while it places the benchmark's pods, and slice variants to attribute it.

bench_scheduler's `--pprof DIR` serves the scheduler's secure port on 127.0.0.1 with
`/debug/pprof/*` open to anonymous requests (`--authorization-always-allow-paths`; without an
authentication kubeconfig every request is anonymous), and `SchedulerProfiler` takes consecutive
CPU profiles of it (`/debug/pprof/profile?seconds=N`, Go's net/http/pprof) from the moment the
scheduler resumes until every pod is bound, each saved as `<label>-<n>.pb.gz`; `go tool pprof
-top DIR/<label>-*.pb.gz` reads them as one.

The variants (`VARIANTS`) change one thing at a time in a node's published slices, so that the
scheduler's CPU per pod can be attributed to what the slices carry: attributes, capacities,
counters consumed, device order, slices per node. They are experiments: a variant without
counters lets the allocator hand out overlapping offers, which no driver may publish.
"""

from __future__ import annotations

import copy
import shutil
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

Obj = dict[str, Any]

#: One profile's length: short, so that the last one ends soon after the last pod is bound.
PROFILE_SECONDS = 5


def pprof_flags(port: int) -> tuple[str, ...]:
    """kube-scheduler flags serving its pprof handlers on 127.0.0.1:`port` to anonymous requests."""
    return (
        f"--secure-port={port}",
        "--bind-address=127.0.0.1",
        "--profiling=true",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/debug/pprof/*",
    )


class SchedulerProfiler:
    """Consecutive CPU profiles of a kube-scheduler, from start() to stop(), saved under `directory`."""

    def __init__(self, port: int, directory: Path, label: str) -> None:
        self.url = f"https://127.0.0.1:{port}/debug/pprof/profile?seconds={PROFILE_SECONDS}"
        self.directory = directory
        self.label = label
        self.files: list[Path] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"pprof-{label}", daemon=True)
        # The scheduler serves a certificate of its own making, for 127.0.0.1 only.
        self._tls = ssl.create_default_context()
        self._tls.check_hostname = False
        self._tls.verify_mode = ssl.CERT_NONE

    def start(self) -> None:
        """Begin profiling (the first profile starts at once)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> list[Path]:
        """End after the profile under way (at most PROFILE_SECONDS more); the files saved."""
        self._stop.set()
        self._thread.join(PROFILE_SECONDS * 3)
        return self.files

    def _loop(self) -> None:
        while not self._stop.is_set():
            path = self.directory / f"{self.label}-{len(self.files):03d}.pb.gz"
            try:
                with urllib.request.urlopen(self.url, timeout=PROFILE_SECONDS * 3, context=self._tls) as r:
                    path.write_bytes(r.read())
            except OSError as err:
                self.errors.append(str(err))
                return
            self.files.append(path)


def top(files: list[Path], nodecount: int = 25, cumulative: bool = False) -> str:
    """`go tool pprof -top` of these profiles as one; a line saying why not where Go is missing."""
    go = shutil.which("go")
    if go is None or not files:
        return "go tool pprof: no Go toolchain on PATH" if go is None else "no profile was taken"
    args = [go, "tool", "pprof", "-top", f"-nodecount={nodecount}", *(["-cum"] if cumulative else [])]
    done = subprocess.run([*args, *map(str, files)], capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else f"go tool pprof failed: {done.stderr.strip()}"


def _specs(slices: list[Obj]) -> list[Obj]:
    return [s["spec"] for s in slices]


def _devices(slices: list[Obj]) -> list[Obj]:
    return [d for s in _specs(slices) for d in s.get("devices") or []]


def _offers(slices: list[Obj]) -> list[Obj]:
    return [d for d in _devices(slices) if d["attributes"].get("type", {}).get("string") == "mig"]


#: What our offers carry beyond NVIDIA's attribute names (its v0.4.1: tests/e2e/test_nvidia_differential.py).
OURS_ONLY = ("parentIndex", "pcieBusID", "resource.kubernetes.io/numaNode", "placementStart", "placementSize")
#: What every selector of the benchmark (the classes' and the claims') reads.
SELECTED = ("type", "profile")


def _without_attributes(names: tuple[str, ...]) -> Callable[[list[Obj]], list[Obj]]:
    def variant(slices: list[Obj]) -> list[Obj]:
        for device in _offers(slices):
            for name in names:
                device["attributes"].pop(name, None)
        return slices

    return variant


def _only_selected(slices: list[Obj]) -> list[Obj]:
    for device in _devices(slices):
        device["attributes"] = {k: v for k, v in device["attributes"].items() if k in SELECTED}
    return slices


def _without_capacity(slices: list[Obj]) -> list[Obj]:
    for device in _offers(slices):
        device.pop("capacity", None)
    return slices


def _without_counters(slices: list[Obj]) -> list[Obj]:
    for spec in _specs(slices):
        spec.pop("sharedCounters", None)
        for device in spec.get("devices") or []:
            device.pop("consumesCounters", None)
    return [s for s in slices if s["spec"].get("devices")]


def _memory_counters_only(slices: list[Obj]) -> list[Obj]:
    """Each offer consumes its memory slices only: the fewest counters that keep placements apart."""

    def memslices(counters: Obj) -> Obj:
        return {k: v for k, v in counters.items() if k.startswith("memslice")}

    for spec in _specs(slices):
        for counter_set in spec.get("sharedCounters") or []:
            counter_set["counters"] = memslices(counter_set["counters"])
        for device in spec.get("devices") or []:
            for consumed in device.get("consumesCounters") or []:
                consumed["counters"] = memslices(consumed["counters"])
    return slices


def _wholes_first(slices: list[Obj]) -> list[Obj]:
    for spec in _specs(slices):
        if spec.get("devices"):
            spec["devices"].sort(key=lambda d: d["attributes"].get("type", {}).get("string") != "gpu")
    return slices


def _slice_per_gpu(slices: list[Obj]) -> list[Obj]:
    """Each counter set in a slice of its own with the devices consuming it, as NVIDIA's driver cuts them
    (where sets sit beside devices: 1.34's layout; other slices are kept)."""
    out = []
    for obj in slices:
        spec = obj["spec"]
        if not (spec.get("sharedCounters") and spec.get("devices")):
            out.append(obj)
            continue
        for counter_set in spec["sharedCounters"]:
            devices = [
                d
                for d in spec["devices"]
                if any(c["counterSet"] == counter_set["name"] for c in d.get("consumesCounters") or [])
            ]
            out.append({**obj, "spec": {**spec, "sharedCounters": [counter_set], "devices": devices}})
    return out


#: Variant name to the change it makes to one node's ResourceSlices.
VARIANTS: dict[str, Callable[[list[Obj]], list[Obj]]] = {
    "no-ours-only-attrs": _without_attributes(OURS_ONLY),
    "no-placement-attrs": _without_attributes(("placementStart", "placementSize")),
    "selected-attrs-only": _only_selected,
    "no-offer-capacity": _without_capacity,
    "no-counters": _without_counters,
    "memslice-counters-only": _memory_counters_only,
    "wholes-first": _wholes_first,
    "slice-per-gpu": _slice_per_gpu,
}


def apply(variant: str, slices: list[Obj]) -> list[Obj]:
    """One node's ResourceSlices changed as `variant` says (copies), still one complete pool."""
    changed = VARIANTS[variant](copy.deepcopy(slices))
    for index, obj in enumerate(changed):
        obj["metadata"] = {**obj["metadata"], "name": f"{obj['spec']['nodeName']}-variant-{index}"}
        obj["spec"]["pool"] = {**obj["spec"]["pool"], "resourceSliceCount": len(changed)}
    return changed
