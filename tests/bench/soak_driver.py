"""Soak: many prepare/unprepare cycles against the real driver process; memory and files must stay flat.

    python -m tests.bench.soak_driver [--cycles 10000] [--profile h100x8]

Starts the local cluster and the driver (a real process on fake GPUs), holds
four claims prepared for the whole run (so the checkpoint is never trivially
empty), then, as the kubelet would, prepares and unprepares 1-GPU claims on
the other devices over the driver's unix socket, one claim per call. At 0, 1k,
5k and 10k cycles (scaled to --cycles) it prints the driver's resident memory,
the checkpoint's size, its open file descriptors and threads, its CDI spec
files, the median cycle time of the last stretch and how many calls had to be
retried (a claim GET that timed out on a loaded machine is retried, as the
kubelet does). Prints figures; asserts only that every call succeeded in the
end and that nothing is left prepared.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from localcluster.cluster import running_cluster
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube

from dra.adapters.nodefiles import CdiStore
from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc
from tests.bench.bench_driver import DRIVER, _claims, _rss_kib

HELD = 4


def _ref(claim: dict[str, object]) -> dra_pb2.Claim:
    meta = claim["metadata"]
    assert isinstance(meta, dict)
    return dra_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def _until_done(call: Any, request: Any, ref: dra_pb2.Claim, attempts: int = 5) -> int:
    """Call for one claim until it succeeds, as the kubelet retries; how many retries it took."""
    for attempt in range(attempts):
        error = call(request(claims=[ref])).claims[ref.uid].error
        if error == "":
            return attempt
        print(f"  retrying {ref.namespace}/{ref.name}: {error}", flush=True)
        time.sleep(1)
    raise AssertionError(f"{ref.namespace}/{ref.name} failed {attempts} times")


def _count(path: Path) -> int:
    return sum(1 for _ in path.iterdir())


def main() -> None:
    """Run the soak and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--profile", default="h100x8")
    args = parser.parse_args()
    marks = sorted({0, args.cycles // 10, args.cycles // 2, args.cycles})

    with running_cluster() as cluster:
        kube = Kube(cluster.kubeconfig)
        log = Path(cluster.run_dir) / "logs" / "dra-gpu-soak.log"
        driver = DriverProcess(cluster, args.profile, log).start()
        try:
            assert driver.proc is not None
            pid = driver.proc.pid
            namespace = f"soak-{uuid.uuid4().hex[:6]}"
            kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
            slices = kube.list_objects(
                "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.driver={DRIVER}"
            )
            devices = sorted(d["name"] for s in slices for d in s["spec"]["devices"])
            held = [_ref(c) for c in _claims(kube, namespace, cluster.node_name, devices[:HELD], HELD)]
            # Claims are named bench-<i> by the shared helper: a second batch needs its own namespace.
            cycling_ns = f"{namespace}-c"
            kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cycling_ns}})
            rest = devices[HELD:]
            cycling = [_ref(c) for c in _claims(kube, cycling_ns, cluster.node_name, rest, len(rest))]
            cdi = CdiStore(Path(cluster.cdi_dir), DRIVER)

            socket = driver.dra_socket
            rows: list[str] = []
            window: list[float] = []
            retries = 0
            with grpc.insecure_channel(f"unix://{socket}") as channel:
                stub = dra_pb2_grpc.DRAPluginStub(channel)
                answer = stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=held))
                assert all(a.error == "" for a in answer.claims.values()), answer

                def mark(done: int) -> None:
                    rss, _ = _rss_kib(pid)
                    median = f"{statistics.median(window):6.2f} ms" if window else "     -   "
                    rows.append(
                        f"{done:>7}  {rss / 1024:8.1f}  {driver.checkpoint.stat().st_size:>10}  "
                        f"{_count(Path(f'/proc/{pid}/fd')):>4}  {_count(Path(f'/proc/{pid}/task')):>7}  "
                        f"{len(cdi.claim_uids()):>5}  {median}  {retries:>7}"
                    )
                    print(rows[-1], flush=True)
                    window.clear()

                print(
                    " cycles  RSS MiB  checkpoint B   fds  threads  specs  median cycle  retries", flush=True
                )
                for done in range(args.cycles + 1):
                    if done in marks:
                        mark(done)
                    if done == args.cycles:
                        break
                    ref = cycling[done % len(cycling)]
                    t0 = time.perf_counter()
                    retries += _until_done(
                        stub.NodePrepareResources, dra_pb2.NodePrepareResourcesRequest, ref
                    )
                    retries += _until_done(
                        stub.NodeUnprepareResources, dra_pb2.NodeUnprepareResourcesRequest, ref
                    )
                    window.append((time.perf_counter() - t0) * 1000)
                stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=held))
            assert cdi.claim_uids() == [], "specs left after unpreparing everything"
            _, peak = _rss_kib(pid)
        finally:
            # The driver is not one of the cluster's processes: stop it even when a call failed.
            driver.stop()
        for name in (namespace, cycling_ns):
            kube.delete("v1", "Namespace", name)
        kube.close()
    print(f"peak RSS {peak / 1024:.1f} MiB; {HELD} claims held throughout, {len(cycling)} cycling")


if __name__ == "__main__":
    main()
