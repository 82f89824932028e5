"""Credentials read without the kubernetes package: in-cluster, token and client-certificate kubeconfigs."""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dra.adapters import kubeconfig
from dra.adapters.kube import KubeClient, KubeError


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate and its key (serving as CA and as client certificate alike)."""
    where = tmp_path_factory.mktemp("pki")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _write(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> str:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "other", "cluster": {"server": "https://wrong"}},
                    {"name": "c", "cluster": cluster},
                ],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    return str(path)


def test_a_token_kubeconfig_with_inline_ca(tmp_path: Path, pem: tuple[Path, Path]) -> None:
    ca = base64.b64encode(pem[0].read_bytes()).decode()
    path = _write(
        tmp_path / "config",
        {"server": "https://10.0.0.1:6443/", "certificate-authority-data": ca, "tls-server-name": "api"},
        {"token": "abc"},
    )
    creds = kubeconfig.from_kubeconfig(path)
    assert creds.host == "https://10.0.0.1:6443"
    assert creds.authorization() == "Bearer abc"
    assert creds.tls_server_name == "api"
    assert creds.tls is not None
    assert creds.tls.verify_mode == ssl.CERT_REQUIRED


def test_client_certificate_files_are_relative_to_the_kubeconfig(
    tmp_path: Path, pem: tuple[Path, Path]
) -> None:
    for source in pem:
        (tmp_path / source.name).write_bytes(source.read_bytes())
    path = _write(
        tmp_path / "config",
        {"server": "https://127.0.0.1:6443", "certificate-authority": "cert.pem"},
        {"client-certificate": "cert.pem", "client-key": "key.pem"},
    )
    creds = kubeconfig.from_kubeconfig(path)
    assert creds.authorization() == ""
    assert creds.tls is not None


def test_skip_verify_and_plain_http(tmp_path: Path) -> None:
    insecure = kubeconfig.from_kubeconfig(
        _write(tmp_path / "a", {"server": "https://h:1", "insecure-skip-tls-verify": True}, {})
    )
    assert insecure.tls is not None
    assert insecure.tls.verify_mode == ssl.CERT_NONE
    assert kubeconfig.from_kubeconfig(_write(tmp_path / "b", {"server": "http://h:1"}, {})).tls is None


def test_a_token_file_is_read_again_after_a_minute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    creds = kubeconfig.from_kubeconfig(
        _write(tmp_path / "config", {"server": "http://h:1"}, {"tokenFile": "token"})
    )
    token.write_text("two\n")
    assert creds.authorization() == "Bearer one"
    monkeypatch.setattr(kubeconfig, "TOKEN_REREAD", 0.0)
    assert creds.authorization() == "Bearer two"


def test_in_cluster(tmp_path: Path, pem: tuple[Path, Path]) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(pem[0].read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    creds = kubeconfig.in_cluster(env, tmp_path)
    assert creds.host == "https://[fd00::1]:443"
    assert creds.authorization() == "Bearer sa-token"
    with pytest.raises(kubeconfig.ConfigError, match="KUBERNETES_SERVICE_HOST"):
        kubeconfig.in_cluster({}, tmp_path)


@pytest.mark.parametrize(
    ("user", "message"),
    [
        ({"exec": {"command": "aws"}}, "user fields \\['exec'\\]"),
        ({"username": "a", "password": "b"}, "password"),
    ],
)
def test_other_ways_to_authenticate_go_to_the_kubernetes_package(
    tmp_path: Path, user: dict[str, Any], message: str
) -> None:
    path = _write(tmp_path / "config", {"server": "http://h:1"}, user)
    with pytest.raises(kubeconfig.UnsupportedConfigError, match=message):
        kubeconfig.from_kubeconfig(path)


def test_a_basic_auth_kubeconfig_still_loads_through_the_kubernetes_package(tmp_path: Path) -> None:
    client = KubeClient(
        _write(tmp_path / "config", {"server": "http://h:1"}, {"username": "a", "password": "b"})
    )
    assert client.host == "http://h:1"
    assert client._credentials.authorization().startswith("Basic ")


def test_bad_kubeconfigs_say_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("")
    with pytest.raises(
        KubeError, match=r"cannot load Kubernetes credentials from kubeconfig .*no current-context"
    ):
        KubeClient(str(tmp_path / "empty"))
    path = tmp_path / "config"
    _write(path, {"server": "http://h:1"}, {})
    path.write_text(path.read_text().replace("name: c\n", "name: d\n"))
    with pytest.raises(KubeError, match="has no cluster named 'c'"):
        KubeClient(str(path))


def test_the_daemons_do_not_import_the_kubernetes_package() -> None:
    code = "import sys, dra.cli, dra.kubeletplugin.daemon; print('kubernetes' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        == "False\n"
    )


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey, ca: bool
) -> x509.Certificate:
    """A certificate with neither key identifier, as some clusters' own PKIs issue them."""
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


def _handshake(context: ssl.SSLContext, chain: Path, key: Path, server_hostname: str) -> None:
    """One TLS handshake with a server serving `chain`; the client's SSLError if it refuses."""
    serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    serving.load_cert_chain(chain, key)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(5)

        def serve() -> None:
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                with serving.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with (
                socket.create_connection(listener.getsockname(), timeout=5) as raw,
                context.wrap_socket(raw, server_hostname=server_hostname) as tls,
            ):
                tls.sendall(b"x")
        finally:
            thread.join(10)
        assert not thread.is_alive()


def test_an_api_server_certificate_without_key_identifiers_is_trusted_as_client_go_trusts_it(
    tmp_path: Path,
) -> None:
    # Python 3.13's default context refuses this chain ("Missing Authority Key Identifier").
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("ca", ca_key, "ca", ca_key, ca=True)
    server = _certificate("api", server_key, "ca", ca_key, ca=False)
    chain, key = tmp_path / "server.crt", tmp_path / "server.key"
    chain.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = kubeconfig.tls_context(None, ca.public_bytes(serialization.Encoding.PEM).decode(), None, True)
    assert not context.verify_flags & ssl.VERIFY_X509_STRICT
    _handshake(context, chain, key, "127.0.0.1")
    # Trust is checked as before: the server's name, and its CA.
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        _handshake(context, chain, key, "127.0.0.2")
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = _certificate("other", other_key, "other", other_key, ca=True)
    other_pem = other.public_bytes(serialization.Encoding.PEM).decode()
    stranger = kubeconfig.tls_context(None, other_pem, None, True)
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer certificate"):
        _handshake(stranger, chain, key, "127.0.0.1")


@pytest.mark.parametrize(
    ("cluster", "user", "named"),
    [
        ({"server": "https://h:1", "certificate-authority": "d"}, {}, "certificate-authority"),
        ({"server": "https://h:1"}, {"client-certificate": "d", "client-key": "d"}, "client-certificate"),
        ({"server": "http://h:1"}, {"tokenFile": "d"}, "token file"),
    ],
)
def test_files_a_kubeconfig_names_are_read_through_the_bounded_reader(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], named: str
) -> None:
    # A directory (or a FIFO, or /dev/zero) where a file belongs: one line naming it, never a hang.
    (tmp_path / "d").mkdir()
    path = _write(tmp_path / "config", cluster, user)
    with pytest.raises(KubeError, match=rf": {named}: {tmp_path / 'd'} is a directory, not a regular file$"):
        KubeClient(path)


def test_an_in_cluster_ca_that_is_no_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").mkdir()
    env = {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(kubeconfig.ConfigError, match=r"ca\.crt is a directory, not a regular file$"):
        kubeconfig.in_cluster(env, tmp_path)


def test_a_token_file_caught_mid_rotation_keeps_the_token_it_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")
    creds = kubeconfig.from_kubeconfig(
        _write(tmp_path / "config", {"server": "http://h:1"}, {"tokenFile": "token"})
    )
    monkeypatch.setattr(kubeconfig, "TOKEN_REREAD", 0.0)
    token.unlink()
    assert creds.authorization() == "Bearer one"
    token.write_text("two\n")
    assert creds.authorization() == "Bearer two"
