"""Credentials for the API server: the in-cluster service account, or a kubeconfig file, read directly.

A server address, its CA, and a bearer token (the service account's read again every minute,
as the kubelet rotates it) or a client certificate: reading those here keeps the `kubernetes`
package out of the process. A kubeconfig whose user authenticates any other way is
UnsupportedConfigError, and dra.adapters.kube hands it to the kubernetes package instead
(docs/architecture.md, "Kubernetes client").
"""

from __future__ import annotations

import base64
import os
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra import documents
from dra.adapters import tlsfiles

#: Where the kubelet mounts a pod's service-account token and the cluster's CA.
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Seconds a token read from a file is used before the file is read again.
TOKEN_REREAD = 60.0


class ConfigError(Exception):
    """The credentials cannot be loaded; the message says what is wrong."""


class UnsupportedConfigError(ConfigError):
    """The kubeconfig authenticates in a way only the kubernetes package implements."""


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to authenticate to it."""

    host: str
    #: None for plain http.
    tls: ssl.SSLContext | None
    #: The Authorization header's value for the next request ("" for none).
    authorization: Callable[[], str]
    tls_server_name: str = ""
    proxy: str = ""


class _TokenFile:
    """A bearer token read from a file, read again once it is older than TOKEN_REREAD."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._token = ""
        self._read_at = -TOKEN_REREAD

    def __call__(self) -> str:
        """The Authorization header; DocumentError naming the file when the first read fails."""
        now = time.monotonic()
        if now - self._read_at >= TOKEN_REREAD:
            try:
                self._token = documents.read_text(self._path, "token file").strip()
            except documents.DocumentError:
                # A rotation caught half-way keeps the token it replaces until the next call.
                if not self._token:
                    raise
                return f"Bearer {self._token}"
            self._read_at = now
        return f"Bearer {self._token}" if self._token else ""


def _anonymous() -> str:
    return ""


def tls_context(
    ca_file: str | None, ca_data: str | None, cert: tuple[bytes, bytes] | None, verify: bool
) -> ssl.SSLContext:
    """TLS to an API server: its CA (file or PEM text), a client certificate and key (PEM), skip-verify.

    A CA file is read through the bounded reader (DocumentError naming it), never by OpenSSL itself.
    """
    if ca_file:
        ca_data = documents.read_text(Path(ca_file), "certificate authority")
    context = ssl.create_default_context(cadata=ca_data or None)
    # Python 3.13 turned strict X.509 checks on by default, refusing a CA without a subject key
    # identifier or a certificate without its issuer's; client-go and the kubelet accept them, and
    # the driver must reach every API server they reach. Trust itself is checked as before.
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    if cert is not None:
        tlsfiles.load_cert_chain(context, *cert)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def in_cluster(environ: Mapping[str, str] = os.environ, account: Path = SERVICE_ACCOUNT) -> Credentials:
    """The pod's service account; ConfigError outside a pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a pod?)")
    token = _TokenFile(account / "token")
    try:
        token()
        tls = tls_context(str(account / "ca.crt"), None, None, verify=True)
    except (OSError, ValueError, ssl.SSLError) as err:
        raise ConfigError(str(err)) from None
    address = f"[{host}]" if ":" in host else host
    return Credentials(f"https://{address}:{port}", tls, token)


def _named(items: Any, name: str, what: str, path: str) -> dict[str, Any]:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(what), dict):
            entry: dict[str, Any] = item[what]
            return entry
    raise ConfigError(f"kubeconfig {path} has no {what} named {name!r}")


def _data(section: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    """A `<key>-data` field (base64) or the file a `<key>` field names; None when neither is set."""
    if section.get(f"{key}-data"):
        return base64.b64decode(section[f"{key}-data"])
    if section.get(key):
        return documents.read_file(base / str(section[key]), key)
    return None


def from_kubeconfig(path: str) -> Credentials:
    """The current context's cluster and user; UnsupportedConfigError for other ways to authenticate."""
    try:
        document = documents.load_yaml(documents.read_file(Path(path), "kubeconfig"), f"kubeconfig {path}")
    except documents.DocumentError as err:
        raise ConfigError(str(err)) from None
    if not isinstance(document, dict) or not document.get("current-context"):
        raise ConfigError(f"kubeconfig {path} names no current-context")
    context = _named(document.get("contexts"), str(document["current-context"]), "context", path)
    cluster = _named(document.get("clusters"), str(context.get("cluster")), "cluster", path)
    user = _named(document.get("users"), str(context["user"]), "user", path) if context.get("user") else {}
    handled = {
        "token",
        "tokenFile",
        "client-certificate",
        "client-certificate-data",
        "client-key",
        "client-key-data",
    }
    if set(user) - handled:
        raise UnsupportedConfigError(f"kubeconfig {path}: user fields {sorted(set(user) - handled)}")
    server = str(cluster.get("server") or "")
    if not server:
        raise ConfigError(f"kubeconfig {path}: cluster {context.get('cluster')!r} has no server")
    base = Path(path).resolve().parent
    try:
        tls = None
        if server.startswith("https:"):
            ca = _data(cluster, "certificate-authority", base)
            cert, key = _data(user, "client-certificate", base), _data(user, "client-key", base)
            tls = tls_context(
                None,
                ca.decode() if ca is not None else None,
                (cert, key) if cert is not None and key is not None else None,
                verify=not cluster.get("insecure-skip-tls-verify", False),
            )
        if user.get("token"):
            bearer = f"Bearer {user['token']}"
            authorization: Callable[[], str] = lambda: bearer  # noqa: E731 (a constant token)
        elif user.get("tokenFile"):
            authorization = _TokenFile(base / str(user["tokenFile"]))
            authorization()
        else:
            authorization = _anonymous
    except (OSError, ValueError, ssl.SSLError) as err:
        raise ConfigError(str(err)) from None
    return Credentials(
        server.rstrip("/"),
        tls,
        authorization,
        tls_server_name=str(cluster.get("tls-server-name") or ""),
        proxy=str(cluster.get("proxy-url") or ""),
    )
