"""A minimal DRA kubelet plugin for testing the harness, run as its own process.

    python -m tests.stubplugin --driver NAME --kubelet-root DIR --events FILE

It serves the DRA v1 service on plugins/<driver>/dra.sock, then the
registration service on plugins_registry/<driver>-reg.sock, prepares every
claim with no devices, and appends one JSON line per kubelet call to FILE, so a
test can see that the real kubelet found it, registered it and called it. It
is not the driver: it checks nothing and writes no CDI specs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc
from dra.pb.pluginregistration.v1 import registration_pb2, registration_pb2_grpc


class _Recorder:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        with self._lock, self._path.open("a") as f:
            f.write(json.dumps({"event": event, **fields}) + "\n")
            f.flush()


class _Registration(registration_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, record: _Recorder) -> None:
        self._driver, self._endpoint, self._record = driver, endpoint, record

    def GetInfo(  # noqa: N802 (gRPC method name)
        self, request: registration_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> registration_pb2.PluginInfo:
        self._record("GetInfo")
        return registration_pb2.PluginInfo(
            type="DRAPlugin", name=self._driver, endpoint=self._endpoint, supported_versions=["v1.DRAPlugin"]
        )

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: registration_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> registration_pb2.RegistrationStatusResponse:
        self._record("NotifyRegistrationStatus", registered=request.plugin_registered, error=request.error)
        return registration_pb2.RegistrationStatusResponse()


class _DRA(dra_pb2_grpc.DRAPluginServicer):
    def __init__(self, record: _Recorder) -> None:
        self._record = record

    def NodePrepareResources(  # noqa: N802
        self, request: dra_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_pb2.NodePrepareResourcesResponse:
        claims = [f"{c.namespace}/{c.name}" for c in request.claims]
        self._record("NodePrepareResources", claims=claims)
        return dra_pb2.NodePrepareResourcesResponse(
            claims={c.uid: dra_pb2.NodePrepareResourceResponse() for c in request.claims}
        )

    def NodeUnprepareResources(  # noqa: N802
        self, request: dra_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        self._record("NodeUnprepareResources", claims=[f"{c.namespace}/{c.name}" for c in request.claims])
        return dra_pb2.NodeUnprepareResourcesResponse(
            claims={c.uid: dra_pb2.NodeUnprepareResourceResponse() for c in request.claims}
        )


def serve(driver: str, kubelet_root: Path, events: Path) -> None:
    """Serve until SIGTERM; remove both sockets on the way out."""
    record = _Recorder(events)
    plugin_dir = kubelet_root / "plugins" / driver
    plugin_dir.mkdir(parents=True, exist_ok=True)
    dra_sock = plugin_dir / "dra.sock"
    reg_sock = kubelet_root / "plugins_registry" / f"{driver}-reg.sock"

    dra_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    dra_pb2_grpc.add_DRAPluginServicer_to_server(_DRA(record), dra_server)
    dra_server.add_insecure_port(f"unix://{dra_sock}")
    dra_server.start()

    reg_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    registration_pb2_grpc.add_RegistrationServicer_to_server(
        _Registration(driver, str(dra_sock), record), reg_server
    )
    reg_server.add_insecure_port(f"unix://{reg_sock}")
    reg_server.start()
    record("serving", pid=os.getpid())

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    reg_server.stop(None).wait()
    dra_server.stop(None).wait()
    for sock in (reg_sock, dra_sock):
        sock.unlink(missing_ok=True)


def events(path: Path) -> list[dict[str, Any]]:
    """The calls recorded so far, one dict per JSON line."""
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@contextlib.contextmanager
def running(driver: str, kubelet_root: Path, events_file: Path) -> Iterator[Path]:
    """The stub as a process, once the kubelet has registered it; yields its events file."""
    # Imported here: the plugin process itself runs without deploy/local on its import path.
    from localcluster.kube import wait_for

    events_file.touch()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.stubplugin",
            f"--driver={driver}",
            f"--kubelet-root={kubelet_root}",
            f"--events={events_file}",
        ]
    )
    try:
        wait_for(
            f"the kubelet to register the stub plugin {driver}",
            lambda: any(
                e["event"] == "NotifyRegistrationStatus" and e["registered"] for e in events(events_file)
            ),
            timeout=30,
        )
        yield events_file
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    """Parse flags and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", required=True)
    parser.add_argument("--kubelet-root", type=Path, required=True)
    parser.add_argument("--events", type=Path, required=True)
    args = parser.parse_args()
    serve(args.driver, args.kubelet_root, args.events)


if __name__ == "__main__":
    main()
