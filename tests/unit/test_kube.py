"""The Kubernetes adapter turns every transport failure into a KubeError the callers handle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import urllib3

from dra.adapters.kube import KubeClient, KubeError, UnreachableError
from tests.unit.helpers import write_kubeconfig


class _Response:
    def __init__(self, data: bytes | Exception) -> None:
        self._data = data

    @property
    def data(self) -> bytes:
        if isinstance(self._data, Exception):
            raise self._data
        return self._data


class _Api:
    def __init__(self, response: _Response) -> None:
        self.response = response

    def call_api(self, *args: Any, **kwargs: Any) -> tuple[_Response, int, dict[str, str]]:
        return self.response, 200, {}

    def close(self) -> None:
        pass


@pytest.fixture
def client(tmp_path: Path) -> KubeClient:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig")
    return KubeClient(str(kubeconfig))


def test_a_connection_lost_mid_body_is_unreachable(client: KubeClient) -> None:
    client._api = _Api(_Response(urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead")))
    with pytest.raises(UnreachableError, match=r"unreachable \(GET /api/v1/nodes/n\): .*Connection broken"):
        client.get_node("n")


def test_a_body_that_is_not_json_is_a_kube_error(client: KubeClient) -> None:
    client._api = _Api(_Response(b"<html>proxy error</html>"))
    with pytest.raises(KubeError, match="the API server's answer is not JSON"):
        client.get_node("n")


def test_a_refused_connection_is_unreachable(client: KubeClient) -> None:
    with pytest.raises(UnreachableError):
        client.get_node("n")
