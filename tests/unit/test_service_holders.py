"""The service reports what the API server answered for a holder's claim; the plan decides what it means."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.kube import KubeError, NotFoundError, UnreachableError
from dra.adapters.nodefiles import CdiStore
from dra.kubeletplugin.service import DraService
from dra.kubeletplugin.state import DeviceState
from dra.pb.dra.v1 import dra_pb2
from tests.unit.helpers import DRIVER, NODE, inventory

HELD = "aaaaaaaa-0000-4000-8000-00000000000a"
NEW = "bbbbbbbb-0000-4000-8000-00000000000b"


class Claims:
    """Two claims of gpu-0: `held` (answered with `answer` where it is an error) and `new`."""

    def __init__(self) -> None:
        self.answer: KubeError | None = None

    def read_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        if name == "held" and self.answer is not None:
            raise self.answer
        result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
        return {
            "metadata": {"namespace": namespace, "name": name, "uid": HELD if name == "held" else NEW},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }

    def write_event(self, involved: dict[str, Any], reason: str, message: str, *, host: str = "") -> None:
        """Events are not what this test looks at."""


def _prepare(service: DraService, name: str, uid: str) -> str:
    request = dra_pb2.NodePrepareResourcesRequest(claims=[dra_pb2.Claim(namespace="ns", name=name, uid=uid)])
    return service.NodePrepareResources(request, None).claims[uid].error  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (KubeError("resourceclaims.resource.k8s.io is forbidden", 403), "HTTP 403: resourceclaims"),
        (KubeError("the server is shutting down", 503), "HTTP 503: the server is shutting down"),
        (UnreachableError("connection refused"), "(connection refused)"),
    ],
)
def test_a_holder_the_api_server_said_nothing_of_stays_and_the_refusal_says_why(
    tmp_path: Path, answer: KubeError, said: str
) -> None:
    state = DeviceState(
        DRIVER,
        NODE,
        inventory("h100x8"),
        CdiStore(tmp_path / "cdi", DRIVER),
        CheckpointStore(tmp_path / "ck"),
    )
    claims = Claims()
    service = DraService(DRIVER, NODE, state, claims)
    assert _prepare(service, "held", HELD) == ""
    claims.answer = answer
    error = _prepare(service, "new", NEW)
    assert (
        f"device gpu-0 is already prepared for claim ns/held ({HELD}), which the API server could not"
        in error
    )
    assert said in error
    assert set(state.prepared) == {HELD}
    # Deleted (404): the kubelet lost track of it, and the new claim takes the GPU.
    claims.answer = NotFoundError("not found", 404)
    assert _prepare(service, "new", NEW) == ""
    assert set(state.prepared) == {NEW}
