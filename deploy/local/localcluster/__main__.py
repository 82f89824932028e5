"""Command line for the local cluster: build, up, down, status.

    python -m localcluster build    # build or reuse the cached binaries (Kubernetes, helm)
    python -m localcluster up       # start; prints the kubeconfig path
    python -m localcluster down     # stop and remove everything
    python -m localcluster status

`up` leaves the cluster running after it returns; its processes and files live
in one directory (DRA_GPU_CLUSTER_DIR, default /tmp/dra-gpu-cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from localcluster.binaries import HELM, BuildError, bin_dir, binary, ensure_binaries, kubernetes_version
from localcluster.cluster import ClusterError, ClusterInfo, LocalCluster, parse_gates, stop_processes


def cluster_dir() -> Path:
    """The directory of the cluster that `up` starts and `down` stops."""
    return Path(os.environ.get("DRA_GPU_CLUSTER_DIR", "/tmp/dra-gpu-cluster"))


def _gates_arg(text: str) -> dict[str, bool]:
    try:
        return parse_gates(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _down(run_dir: Path) -> bool:
    try:
        info = ClusterInfo.load(run_dir)
    except FileNotFoundError:
        if run_dir.exists():
            shutil.rmtree(run_dir, ignore_errors=True)
        return False
    stop_processes(info.pids)
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build or reuse the Kubernetes binaries")
    up = sub.add_parser("up", help="start the cluster and print its kubeconfig path")
    up.add_argument(
        "--feature-gates",
        type=_gates_arg,
        default=_gates_arg(os.environ.get("DRA_GPU_FEATURE_GATES", "")),
        help="extra gates, e.g. DRADeviceTaints=false (default: the harness set)",
    )
    sub.add_parser("down", help="stop the cluster and remove its files")
    sub.add_parser("status", help="print the running cluster's paths as JSON")
    args = parser.parse_args(argv)

    try:
        if args.command == "build":
            print(ensure_binaries())
            print(f"Kubernetes {kubernetes_version()} binaries in {bin_dir()}", file=sys.stderr)
            print(f"helm {HELM.version()}: {binary('helm')}", file=sys.stderr)
        elif args.command == "up":
            run_dir = cluster_dir()
            if _down(run_dir):
                print(f"stopped the previous cluster in {run_dir}", file=sys.stderr)
            run_dir.mkdir(parents=True)
            info = LocalCluster(run_dir=run_dir, feature_gates=args.feature_gates).start()
            print(info.kubeconfig)
            print(
                f"node {info.node_name} Ready; kubelet root {info.kubelet_root}; CDI dir {info.cdi_dir}\n"
                f"try: {bin_dir() / 'kubectl'} --kubeconfig {info.kubeconfig} get nodes",
                file=sys.stderr,
            )
        elif args.command == "down":
            if not _down(cluster_dir()):
                print("no cluster was running", file=sys.stderr)
        elif args.command == "status":
            print(json.dumps(vars(ClusterInfo.load(cluster_dir())), indent=2))
    except (BuildError, ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except FileNotFoundError:
        print(f"error: no cluster running in {cluster_dir()} (run `make cluster-up`)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
