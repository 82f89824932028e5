"""The webhook over HTTPS: reviews answered, garbage refused, a rotated certificate served at once."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from aiohttp import web
from localcluster.pki import CertificateAuthority, KeyPair

from dra.cli import main
from dra.daemon.bootstrap import StartupError
from dra.webhook.server import Certificates, application

pytestmark = pytest.mark.anyio

DRIVER = "gpu.nvidia.com"
#: The served application's body timeout: short, so that the slow-client tests are quick.
BODY_TIMEOUT = 0.5


@dataclass
class Served:
    port: int
    ca: CertificateAuthority
    pair: KeyPair
    certificates: Certificates


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    ca = CertificateAuthority(tmp_path / "pki")
    issued = ca.issue("first", "webhook", hosts=("127.0.0.1",), server=True)
    # The files the webhook reads, as a mounted Secret gives them: rotated in place.
    pair = KeyPair(tmp_path / "tls.crt", tmp_path / "tls.key")
    shutil.copy(issued.cert, pair.cert)
    shutil.copy(issued.key, pair.key)
    certificates = Certificates(pair.cert, pair.key)
    runner = web.AppRunner(application(DRIVER, body_timeout=BODY_TIMEOUT))
    await runner.setup()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=certificates.context).start()
    try:
        yield Served(port, ca, pair, certificates)
    finally:
        await runner.cleanup()


def _connect(served: Served) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(served.ca.cert_path))
    raw = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def _head(length: int, content_type: str = "application/json") -> bytes:
    return (
        f"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()


def _post(
    served: Served, body: bytes, content_type: str = "application/json", sent: int | None = None
) -> tuple[int, Any, bytes]:
    """POST /validate trusting only the test CA: (status, JSON answer, the server's certificate).

    `sent`: send only that many bytes of the body, then wait for the answer.
    """
    with _connect(served) as tls:
        peer = tls.getpeercert(binary_form=True) or b""
        tls.sendall(_head(len(body), content_type) + body[:sent])
        # Read the answer by its Content-Length, not to the end: a server that closes a TLS
        # connection waits for the client's close_notify, which comes only once this returns.
        data = b""
        while b"\r\n\r\n" not in data and (chunk := tls.recv(65536)):
            data += chunk
        head, _, payload = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(payload) < length and (chunk := tls.recv(65536)):
            payload += chunk
    status = int(head.split(b" ")[1])
    return status, json.loads(payload), peer


def _claim_review(interval: str) -> bytes:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "spec": {
            "devices": {
                "config": [
                    {
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {
                                "apiVersion": "resource.nvidia.com/v1beta1",
                                "kind": "GpuConfig",
                                "sharing": {"timeSlicingConfig": {"interval": interval}},
                            },
                        }
                    }
                ]
            }
        },
    }
    request = {"uid": "u-1", "kind": {"kind": "ResourceClaim"}, "operation": "CREATE", "object": claim}
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


async def test_reviews_are_answered_over_https(served: Served) -> None:
    status, answer, _ = await anyio.to_thread.run_sync(_post, served, _claim_review("Default"))
    assert (status, answer["response"]) == (200, {"uid": "u-1", "allowed": True})
    status, answer, _ = await anyio.to_thread.run_sync(_post, served, _claim_review("Never"))
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert (
        "spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval"
        in (answer["response"]["status"]["message"])
    )


async def test_a_body_that_is_not_a_review_is_a_bad_request(served: Served) -> None:
    status, answer, _ = await anyio.to_thread.run_sync(_post, served, b"{not json")
    assert status == 400
    assert "error" in answer
    status, answer, _ = await anyio.to_thread.run_sync(_post, served, b'{"kind": "Pod"}')
    assert (status, answer) == (400, {"error": "expected an AdmissionReview of admission.k8s.io/v1"})


async def test_a_rotated_certificate_is_served_to_new_connections(served: Served) -> None:
    _, _, before = await anyio.to_thread.run_sync(_post, served, _claim_review("Default"))
    assert served.certificates.reload_if_changed() is None
    rotated = served.ca.issue("second", "webhook", hosts=("127.0.0.1",), server=True)
    shutil.copy(rotated.cert, served.pair.cert)
    shutil.copy(rotated.key, served.pair.key)
    assert served.certificates.reload_if_changed() is True
    _, _, after = await anyio.to_thread.run_sync(_post, served, _claim_review("Default"))
    assert after != before
    assert after == ssl.PEM_cert_to_DER_cert(rotated.cert.read_text())


async def test_a_half_written_rotation_keeps_the_old_certificate(served: Served) -> None:
    _, _, before = await anyio.to_thread.run_sync(_post, served, _claim_review("Default"))
    other = served.ca.issue("other", "webhook", hosts=("127.0.0.1",), server=True)
    shutil.copy(other.cert, served.pair.cert)  # the key is still the old one: a mismatch
    assert served.certificates.reload_if_changed() is False
    status, _, after = await anyio.to_thread.run_sync(_post, served, _claim_review("Default"))
    assert (status, after) == (200, before)
    shutil.copy(other.key, served.pair.key)
    assert served.certificates.reload_if_changed() is True


def test_unloadable_files_stop_the_start(tmp_path: Path) -> None:
    missing = tmp_path / "none.crt"
    with pytest.raises(
        StartupError, match=f"^--tls-cert-file: cannot read {missing}: No such file or directory$"
    ):
        Certificates(missing, tmp_path / "none.key")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text("not a certificate")
    key.write_text("not a key")
    with pytest.raises(StartupError, match=f"^cannot load --tls-cert-file {cert} and --tls-key-file {key}: "):
        Certificates(cert, key)


@pytest.mark.parametrize("flag", ["--tls-cert-file", "--tls-key-file"])
@pytest.mark.parametrize(("what", "kind"), [("/dev/zero", "a character device"), ("dir", "a directory")])
def test_a_certificate_or_key_that_is_no_file_is_refused_unread(
    tmp_path: Path, flag: str, what: str, kind: str
) -> None:
    # /dev/zero was read until memory ran out (MemoryError), by the change check and by OpenSSL.
    issued = CertificateAuthority(tmp_path / "pki").issue(
        "first", "webhook", hosts=("127.0.0.1",), server=True
    )
    target = Path(what)
    if not target.is_absolute():
        target = tmp_path / what
        target.mkdir()
    pair = (target, issued.key) if flag == "--tls-cert-file" else (issued.cert, target)
    with pytest.raises(StartupError, match=f"^{flag}: {target} is {kind}, not a regular file$"):
        Certificates(*pair)


def test_the_command_says_what_stops_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    assert main(["webhook", f"--tls-cert-file={cert}", f"--tls-key-file={key}", "--http-address="]) == 1
    assert (
        capsys.readouterr().err
        == f"dra-gpu: error: --tls-cert-file: cannot read {cert}: No such file or directory\n"
    )
    assert main(["webhook", "--tls-cert-file=/dev/zero", f"--tls-key-file={key}", "--http-address="]) == 1
    assert (
        capsys.readouterr().err
        == "dra-gpu: error: --tls-cert-file: /dev/zero is a character device, not a regular file\n"
    )
    with pytest.raises(SystemExit):
        main(["webhook", f"--tls-cert-file={cert}", f"--tls-key-file={key}", "--bind-address=8443"])
    assert "--bind-address: expected host:port, got '8443'" in capsys.readouterr().err


async def test_malformed_reviews_are_4xx_with_the_reason_never_500(served: Served) -> None:
    deep = b"[" * 3000 + b"]" * 3000
    status, answer, _ = await anyio.to_thread.run_sync(_post, served, deep)
    assert (status, answer) == (400, {"error": "the request body: nested deeper than 100 levels"})
    review = json.loads(_claim_review("Default"))
    review["request"]["kind"] = "ResourceClaim"
    status, answer, _ = await anyio.to_thread.run_sync(_post, served, json.dumps(review).encode())
    assert status == 400
    assert answer["error"].startswith("request.kind: expected an object")
    status, answer, _ = await anyio.to_thread.run_sync(
        lambda: _post(served, _claim_review("Default"), content_type="text/plain")
    )
    assert (status, answer) == (415, {"error": "expected Content-Type application/json, got 'text/plain'"})


async def test_a_body_that_stops_half_way_is_answered_408_after_the_timeout(served: Served) -> None:
    body = _claim_review("Default")
    with anyio.fail_after(BODY_TIMEOUT + 5):
        status, answer, _ = await anyio.to_thread.run_sync(lambda: _post(served, body, sent=len(body) // 2))
    assert (status, answer) == (408, {"error": f"the body did not arrive within {BODY_TIMEOUT:g} s"})


async def test_a_client_that_goes_away_mid_body_is_one_log_line(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)

    def abort() -> None:
        with _connect(served) as tls:
            tls.sendall(_head(1000) + b'{"apiVersion": ')

    await anyio.to_thread.run_sync(abort)
    await anyio.sleep(0.2)
    records = [r for r in caplog.records if r.levelno >= logging.INFO and "aiohttp.access" not in r.name]
    assert [r.getMessage().split(":")[0] for r in records] == [
        "client 127.0.0.1 closed the connection before sending its body"
    ]
    assert not [r for r in records if r.exc_info]
