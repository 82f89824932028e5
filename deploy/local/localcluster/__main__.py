"""Command line for the local cluster: build, up, down, status.

    python -m localcluster build    # build or reuse the cached binaries (Kubernetes, helm)
    python -m localcluster up       # start; prints the kubeconfig path
    python -m localcluster down     # stop and remove everything, a demo's cluster included
    python -m localcluster status

`up` leaves the cluster running after it returns; its processes and files live
in one directory (DRA_GPU_CLUSTER_DIR, default /tmp/dra-gpu-cluster). A SIGINT,
SIGTERM or SIGHUP before it returns stops what it started. KUBERNETES_VERSION
picks the release (default: the one deploy/local/k8sbin/go.mod pins),
CONTAINER_RUNTIME the runtime (fake, the default, or containerd).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from localcluster.binaries import HELM, bin_dir, binary, ensure_binaries, ensure_binary, kubernetes_version
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterError, ClusterInfo, cluster_dir, demo_dir
from localcluster.gomodule import BuildError
from localcluster.kubereleases import parse_gates
from localcluster.processes import Stopped, stop_on_signals, stop_run_dir


def _gates_arg(text: str) -> dict[str, bool]:
    try:
        return parse_gates(text)
    except (ValueError, BuildError, ClusterError) as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build or reuse the Kubernetes binaries")
    up = sub.add_parser("up", help="start the cluster and print its kubeconfig path")
    up.add_argument(
        "--feature-gates",
        type=_gates_arg,
        default=os.environ.get("DRA_GPU_FEATURE_GATES", ""),
        help="extra gates, e.g. DRADeviceTaints=false (default: the harness set of the release)",
    )
    sub.add_parser("down", help="stop the cluster and remove its files")
    sub.add_parser("status", help="print the running cluster's paths as JSON")
    args = parser.parse_args(argv)

    try:
        if args.command == "build":
            print(ensure_binaries())
            print(
                f"Kubernetes {kubernetes_version()} binaries in {bin_dir()}",
                file=sys.stderr,
            )
            print(f"helm {HELM.version()}: {binary('helm')}", file=sys.stderr)
        elif args.command == "up":
            with stop_on_signals():
                _up(args.feature_gates)
        elif args.command == "down":
            stopped = [str(run_dir) for run_dir in (cluster_dir(), demo_dir()) if stop_run_dir(run_dir)]
            print(
                f"stopped the cluster in {', '.join(stopped)}" if stopped else "no cluster was running",
                file=sys.stderr,
            )
        elif args.command == "status":
            print(json.dumps(vars(ClusterInfo.load(cluster_dir())), indent=2))
    except (BuildError, ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except Stopped as stop:
        print(f"{stop}: stopped everything it had started", file=sys.stderr)
        return stop.exit_status
    except FileNotFoundError:
        print(f"error: no cluster running in {cluster_dir()} (run `make cluster-up`)", file=sys.stderr)
        return 1
    return 0


def _up(feature_gates: dict[str, bool]) -> None:
    run_dir = cluster_dir()
    if stop_run_dir(run_dir):
        print(f"stopped the previous cluster in {run_dir}", file=sys.stderr)
    run_dir.mkdir(parents=True)
    cluster = LocalCluster(run_dir=run_dir, feature_gates=feature_gates)
    try:
        info = cluster.start()
        kubectl = ensure_binary("kubectl")
    except Stopped:
        cluster.stop()
        raise
    print(info.kubeconfig)
    print(
        f"Kubernetes {info.kubernetes_version} on the {info.container_runtime} runtime: node "
        f"{info.node_name} Ready; kubelet root {info.kubelet_root}; CDI dir {info.cdi_dir}\n"
        f"try: {kubectl} --kubeconfig {info.kubeconfig} get nodes",
        file=sys.stderr,
    )


if __name__ == "__main__":
    sys.exit(main())
