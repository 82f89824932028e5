"""Benchmark: what the start-up feature probe (dry-run creates of throwaway ResourceSlices) costs.

    PYTHONPATH=deploy/local .venv/bin/python -m tests.bench.bench_features [--runs 50]
    KUBERNETES_VERSION=v1.37.2 ... (two dry-runs there: counters in a slice of their own)

Starts the local cluster, then runs detect_features `--runs` times on one
client (as the driver does once at start) and prints the latency and what it
found. Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import anyio
from localcluster.cluster import LocalCluster

from dra.adapters.kube import KubeClient
from dra.core import versions
from dra.kubeletplugin.features import detect_features


async def _measure(kubeconfig: str, node: str, runs: int) -> None:
    kube = KubeClient(kubeconfig)
    try:
        info = versions.server_info(await kube.server_version(), await kube.resource_api_group())
        timings = []
        found = None
        for _ in range(runs):
            started = time.perf_counter()
            found = await detect_features(kube, info, "gpu.nvidia.com", node)
            timings.append((time.perf_counter() - started) * 1000)
        stored, _ = await kube.list_resource_slices("gpu.nvidia.com", node)
    finally:
        await kube.aclose()
    timings.sort()
    creates = len(versions.probe_slices("gpu.nvidia.com", node, info.minor))
    print(f"API server {info.git_version}: {creates} dry-run create(s)")
    print(
        f"detect_features over {runs} runs: p50 {statistics.median(timings):.1f} ms, "
        f"p99 {timings[int(len(timings) * 0.99) - 1]:.1f} ms, min {timings[0]:.1f} ms"
    )
    print(f"found: {found}; slices stored by the probes: {len(stored)}")


def main() -> None:
    """Start a cluster, measure, stop it."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    cluster = LocalCluster()
    try:
        info = cluster.start()
        anyio.run(_measure, info.kubeconfig, info.node_name, args.runs)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
