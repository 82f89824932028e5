"""Which API servers the driver starts against (dra.core.versions, the kubelet-plugin's start-up check)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from dra.core.versions import ServerInfo, UnsupportedServerError, check, server_info
from dra.daemon.bootstrap import StartupError
from dra.kubeletplugin.daemon import check_server
from tests.unit.test_kube import Server, _client, _response

GROUP_V1 = {
    "kind": "APIGroup",
    "name": "resource.k8s.io",
    "versions": [{"version": "v1"}, {"version": "v1beta2"}],
}


def _version(git: str, minor: str) -> dict[str, str]:
    return {"major": "1", "minor": minor, "gitVersion": git}


@pytest.mark.parametrize(
    ("minor", "git", "expected"),
    [("34", "v1.34.12", 34), ("37+", "v1.37.2-eks-1", 37), ("", "v1.35.4", 35), ("", "weird", 0)],
)
def test_the_minor_comes_from_minor_or_else_the_git_version(minor: str, git: str, expected: int) -> None:
    assert server_info(_version(git, minor), GROUP_V1).minor == expected


def test_a_supported_server_passes_quietly() -> None:
    for minor in (34, 35, 36, 37):
        assert check(server_info(_version(f"v1.{minor}.0", str(minor)), GROUP_V1)) == []


def test_a_newer_server_is_a_warning() -> None:
    (warning,) = check(server_info(_version("v1.38.0", "38"), GROUP_V1))
    assert warning == (
        "the API server is v1.38.0, newer than the newest tested release (Kubernetes 1.34 to 1.37)"
    )


def test_an_older_server_is_refused_with_the_supported_range() -> None:
    with pytest.raises(
        UnsupportedServerError,
        match=r"^the API server is v1\.33\.4; dra-gpu needs Kubernetes 1\.34 to 1\.37$",
    ):
        check(ServerInfo("v1.33.4", 33, ("v1",)))


def test_a_server_without_resource_v1_is_refused_saying_what_it_serves() -> None:
    with pytest.raises(UnsupportedServerError) as raised:
        check(
            server_info(
                _version("v1.33.4", "33"), {"versions": [{"version": "v1beta2"}, {"version": "v1beta1"}]}
            )
        )
    assert str(raised.value) == (
        "the API server (v1.33.4) does not serve resource.k8s.io/v1 (it serves: v1beta2, v1beta1); "
        "dra-gpu needs Kubernetes 1.34 to 1.37 with the resource.k8s.io/v1 API enabled"
    )
    with pytest.raises(UnsupportedServerError, match=r"\(it serves: none\)"):
        check(server_info(_version("v1.31.0", "31"), None))


@pytest.mark.anyio
async def test_the_plugin_refuses_to_start_against_an_old_api_server(tmp_path: Path) -> None:
    server = Server(
        [_response(200, json.dumps(_version("v1.33.4", "33")).encode())],
        [_response(404, json.dumps({"kind": "Status", "code": 404, "message": "not found"}).encode())],
    )
    async with _client(tmp_path, server) as client:
        with pytest.raises(StartupError, match=r"does not serve resource\.k8s\.io/v1 \(it serves: none\)"):
            await check_server(client)


@pytest.mark.anyio
async def test_an_api_server_that_does_not_answer_is_not_a_startup_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = Server([_response(500, b'{"message": "etcd is down"}')])
    async with _client(tmp_path, server) as client:
        with caplog.at_level(logging.WARNING, logger="dra.kubeletplugin.daemon"):
            await check_server(client)
    assert (
        "cannot ask the API server which version it is (GET /version: 500 etcd is down); going on"
        in caplog.text
    )
