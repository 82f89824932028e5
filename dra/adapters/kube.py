"""The Kubernetes API adapter: the only module that imports a Kubernetes or HTTP client library.

Objects travel as plain JSON dicts, exactly as the API server sends them, so the pure modules
work on the documented wire format. Every call is a coroutine whose request runs on a worker
thread over the blocking keep-alive connections of dra.adapters.kubeget (its transport), with the
credentials of dra.adapters.kubeconfig (the `kubernetes` package only for the kubeconfigs it
cannot read); the prepare's claim GET is made directly from the thread that runs the prepare.
Failures are KubeError subclasses naming the object and the server's answer.
Why this client, and the figures: docs/architecture.md ("Kubernetes client").
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import anyio.to_thread

from dra.adapters import kubeconfig as credentials
from dra.adapters.kubeget import MAX_BODY, BlockingPool
from dra.api.fields import object_pairs
from dra.documents import bounded_int, read_file

log = logging.getLogger(__name__)

Obj = dict[str, Any]

RESOURCE_API = "/apis/resource.k8s.io/v1"
_JSON = "application/json"
_MERGE_PATCH = "application/merge-patch+json"
# JSON is YAML: a server-side apply body goes as JSON.
_APPLY_PATCH = "application/apply-patch+yaml"


class KubeError(Exception):
    """An API call failed. `status` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class NotFoundError(KubeError):
    """404."""


class ConflictError(KubeError):
    """409: a stale resourceVersion or an object that already exists."""


class UnreachableError(KubeError):
    """The API server did not answer (connection refused, timeout, TLS failure)."""


def _reason(body: str | bytes | None) -> str:
    try:
        message = json.loads(body or b"{}").get("message")
    except (ValueError, AttributeError):
        message = None
    if message:
        return str(message)
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    return text[:200]


def _status_error(what: str, status: int, body: bytes) -> KubeError:
    message = f"{what}: {status} {_reason(body)}"
    if status == 404:
        return NotFoundError(message, status)
    if status == 409:
        return ConflictError(message, status)
    return KubeError(message, status)


def _tls(config: Any) -> ssl.SSLContext:
    """The TLS settings the kubernetes package loaded (CA, client certificate, skip-verify)."""
    cert = None
    if config.cert_file:
        # A kubeconfig may keep the key in the certificate's file.
        key_file = config.key_file or config.cert_file
        cert = (
            read_file(Path(config.cert_file), "client-certificate"),
            read_file(Path(key_file), "client-key"),
        )
    return credentials.tls_context(config.ssl_ca_cert, None, cert, bool(config.verify_ssl))


def _from_kubernetes_package(kubeconfig: str) -> credentials.Credentials:
    """A kubeconfig only the kubernetes package reads: it also refreshes the tokens it issues."""
    import kubernetes

    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
    except kubernetes.config.ConfigException as err:
        raise credentials.ConfigError(str(err)) from None
    tls = _tls(config) if str(config.host).startswith("https:") else None

    def authorization() -> str:
        # Exec plugins and auth providers renew expiring tokens here.
        return str(config.get_api_key_with_prefix("authorization") or "")

    return credentials.Credentials(
        str(config.host), tls, authorization, config.tls_server_name or "", config.proxy or ""
    )


def load_credentials(kubeconfig: str | None) -> credentials.Credentials:
    """Credentials from a kubeconfig file, or the in-cluster service account; KubeError says why not."""
    try:
        if not kubeconfig:
            return credentials.in_cluster()
        try:
            return credentials.from_kubeconfig(kubeconfig)
        except credentials.UnsupportedConfigError:
            return _from_kubernetes_package(kubeconfig)
    except (credentials.ConfigError, OSError, ValueError, ssl.SSLError) as err:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
        raise KubeError(f"cannot load Kubernetes credentials from {where}: {err}") from None


def _claim_path(namespace: str, name: str) -> str:
    # The kubelet's names go into the path: quoted, `a?watch=1` or `../..` stays one (absent) name.
    ns, claim = urllib.parse.quote(namespace, safe=""), urllib.parse.quote(name, safe="")
    return f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{claim}"


#: The key of opaque configuration parameters (a DeviceClass's or a claim's config, an allocation's):
#: the API server writes it as its Go field tag, never escaped.
_PARAMETERS = b'"parameters"'


def _loads(data: bytes | bytearray) -> Any:
    """The API server's JSON, decoded as dra.api.opaque needs it where it holds opaque parameters.

    There a key given twice is kept as a DuplicatedKeys and an integer too long for int() becomes an
    infinity, so that the parameters are refused with the field's path. Those hooks run Python for
    every object and integer: an answer with no parameters (most claims, every status apply's answer,
    slices, watch events) takes the C decoder alone, half the CPU of a claim GET (docs/testing.md).
    Its ValueError (an integer too long, or no JSON) falls back to the hooks, which decide as before.
    """
    if _PARAMETERS not in data:
        with contextlib.suppress(ValueError):
            return json.loads(data)
    # Integers too long for int() become infinities that the field's decoder refuses.
    return json.loads(data, parse_int=bounded_int, object_pairs_hook=object_pairs)


def _decode(what: str, status: int, data: bytes) -> Any:
    """An answer's JSON, or the KubeError its status or body says."""
    if status >= 400:
        raise _status_error(what, status, data)
    try:
        return _loads(data or b"{}")
    except (ValueError, RecursionError) as err:
        raise KubeError(f"{what}: the API server's answer is not JSON ({err})") from None


def _event(what: str, line: bytes | bytearray) -> tuple[str, Obj]:
    """One watch event's type and object; KubeError for an ERROR event (410: list again) or a bad one."""
    try:
        event = _loads(line)
        if event.get("type") == "ERROR":
            status = event.get("object", {})
            raise KubeError(f"watch {what}: {status.get('message')}", int(status.get("code", 0)))
        return str(event["type"]), event["object"]
    except (ValueError, KeyError, AttributeError, TypeError, RecursionError) as err:
        raise KubeError(f"watch {what}: an event is not what the API server sends ({err!r})") from None


def _describe(err: BaseException) -> str:
    # A timeout says nothing by itself.
    return str(err) or f"no answer in time ({type(err).__name__})"


class KubeClient:
    """A connection to one API server, from a kubeconfig file or the in-cluster service account.

    Construct it anywhere and call it from any event loop or thread: connections open on the
    first call and are kept for the next; `aclose()` closes the idle ones.
    """

    def __init__(self, kubeconfig: str | None = None, timeout: float = 10.0) -> None:
        self._credentials = load_credentials(kubeconfig)
        self.host = self._credentials.host
        try:
            self._pool = BlockingPool(
                self.host,
                self._credentials.tls,
                self._credentials.authorization,
                self._credentials.tls_server_name,
                timeout,
                self._credentials.proxy,
            )
        except ValueError as err:
            raise KubeError(f"cannot reach the API server {self.host}: {err}") from None

    async def aclose(self) -> None:
        """Release connections."""
        self._pool.close()

    async def open_connections(self) -> int:
        """Open the 8 idle connections kept before concurrent calls need them; how many (UnreachableError)."""
        try:
            return await anyio.to_thread.run_sync(self._pool.open_idle, abandon_on_cancel=True)
        except OSError as err:
            raise self._unreachable("opening connections", err) from None

    def _unreachable(self, what: str, err: BaseException) -> UnreachableError:
        return UnreachableError(f"API server {self.host} unreachable ({what}): {_describe(err)}")

    def _send(
        self, method: str, path: str, body: Obj | None, query: dict[str, str] | None, content_type: str
    ) -> Any:
        """One request from the calling thread: the answer's JSON, or the KubeError for it."""
        what = f"{method} {path}"
        target = f"{path}?{urllib.parse.urlencode(query)}" if query else path
        # Compact: the server keeps a status entry's data as the bytes it was sent, and 1.37 counts
        # an entry whose bytes another write re-encodes as changed by that writer.
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        try:
            status, answer = self._pool.request(method, target, data, content_type)
        except OSError as err:
            raise self._unreachable(what, err) from None
        return _decode(what, status, answer)

    async def _call(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        query: dict[str, str] | None = None,
        content_type: str = _JSON,
    ) -> Any:
        # Fail fast, never retry: the kubelet gives a prepare call about 45 s, and callers retry.
        # A cancelled call returns at once; its request ends at its deadline, or when aclose() cuts it.
        return await anyio.to_thread.run_sync(
            self._send, method, path, body, query, content_type, abandon_on_cancel=True
        )

    # -- reads ---------------------------------------------------------------

    async def server_version(self) -> Obj:
        """GET /version: the server's gitVersion, major and minor."""
        result: Obj = await self._call("GET", "/version")
        return result

    async def resource_api_group(self) -> Obj | None:
        """GET /apis/resource.k8s.io: the versions of the group it serves; None when not served."""
        try:
            result: Obj = await self._call("GET", "/apis/resource.k8s.io")
        except NotFoundError:
            return None
        return result

    async def get_resource_claim(self, namespace: str, name: str) -> Obj:
        """GET a ResourceClaim (resource.k8s.io/v1)."""
        result: Obj = await self._call("GET", _claim_path(namespace, name))
        return result

    def read_resource_claim(self, namespace: str, name: str) -> Obj:
        """GET a ResourceClaim from the calling thread (the gRPC server's): blocks it, never an event loop."""
        result: Obj = self._send("GET", _claim_path(namespace, name), None, None, _JSON)
        return result

    def write_resource_claim_devices(
        self, namespace: str, name: str, uid: str, devices: list[Obj], field_manager: str
    ) -> Obj:
        """Server-side apply a ResourceClaim's status.devices entries as `field_manager`; the claim as stored.

        Blocks the calling thread, never an event loop (the status writer makes its writes on a
        thread of its own, dra.kubeletplugin.claimstatus).

        status.devices is a map keyed by driver, pool, device (and share): an apply changes only
        the entries this manager owns, so other drivers' entries stay, and applying an empty
        list removes this manager's. The UID in the body makes an apply to a claim re-created
        under the same name fail (metadata.uid is immutable) instead of writing to it.
        """
        ns, claim = urllib.parse.quote(namespace, safe=""), urllib.parse.quote(name, safe="")
        body: Obj = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "status": {"devices": devices},
        }
        result: Obj = self._send(
            "PATCH",
            f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{claim}/status",
            body,
            {"fieldManager": field_manager, "force": "true"},
            _APPLY_PATCH,
        )
        return result

    async def get_node(self, name: str) -> Obj:
        """GET a Node."""
        result: Obj = await self._call("GET", f"/api/v1/nodes/{name}")
        return result

    async def patch_node_labels(self, name: str, labels: dict[str, str], remove: Iterable[str] = ()) -> Obj:
        """Set `labels` on a Node and remove the `remove` keys, in one merge patch; other labels stay.

        A merge patch changes only the keys it names, so no resourceVersion is
        needed: a label another writer changes meanwhile is not overwritten.
        """
        patch: dict[str, str | None] = {**dict.fromkeys(remove), **labels}
        return await self._patch_metadata(f"/api/v1/nodes/{urllib.parse.quote(name)}", {"labels": patch})

    async def _patch_metadata(self, path: str, metadata: Obj) -> Obj:
        """One JSON merge patch of an object's metadata: only the keys it names change."""
        result: Obj = await self._call("PATCH", path, body={"metadata": metadata}, content_type=_MERGE_PATCH)
        return result

    async def get_device_class(self, name: str) -> Obj:
        """GET a DeviceClass."""
        result: Obj = await self._call("GET", f"{RESOURCE_API}/deviceclasses/{name}")
        return result

    async def list_resource_claims(self) -> list[Obj]:
        """Every ResourceClaim of the cluster (to see which devices are allocated)."""
        result = await self._call("GET", f"{RESOURCE_API}/resourceclaims")
        return list(result.get("items") or [])

    async def list_node_pods(self, node_name: str) -> list[Obj]:
        """The Pods bound to one node (to name the pods and containers of GPU processes)."""
        result = await self._call(
            "GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node_name}"}
        )
        return list(result.get("items") or [])

    async def list_node_resource_slices(self, node_name: str) -> list[Obj]:
        """The ResourceSlices of every driver on one node."""
        result = await self._call(
            "GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={node_name}"}
        )
        return list(result.get("items") or [])

    # -- ResourceSlices ------------------------------------------------------

    @staticmethod
    def _slice_selector(driver: str, node_name: str) -> str:
        return f"spec.driver={driver},spec.nodeName={node_name}"

    async def list_resource_slices(self, driver: str, node_name: str) -> tuple[list[Obj], str]:
        """This driver's slices of one node, and the list's resourceVersion (for a watch)."""
        result = await self._call(
            "GET",
            f"{RESOURCE_API}/resourceslices",
            query={"fieldSelector": self._slice_selector(driver, node_name)},
        )
        return list(result.get("items") or []), str(result["metadata"].get("resourceVersion", ""))

    async def create_resource_slice(self, obj: Obj, dry_run: bool = False) -> Obj:
        """POST a ResourceSlice; with dry_run the server validates and answers what it would store."""
        query = {"dryRun": "All"} if dry_run else None
        result: Obj = await self._call("POST", f"{RESOURCE_API}/resourceslices", body=obj, query=query)
        return result

    async def dry_run_create_resource_slice(self, obj: Obj) -> Obj:
        """POST a ResourceSlice with dryRun=All: the object as the server would store it, nothing stored."""
        result: Obj = await self._call(
            "POST", f"{RESOURCE_API}/resourceslices", body=obj, query={"dryRun": "All"}
        )
        return result

    async def replace_resource_slice(self, obj: Obj) -> Obj:
        """PUT a ResourceSlice; its metadata.resourceVersion guards against lost updates."""
        name = obj["metadata"]["name"]
        result: Obj = await self._call("PUT", f"{RESOURCE_API}/resourceslices/{name}", body=obj)
        return result

    async def annotate_resource_slice(self, name: str, annotations: dict[str, str]) -> Obj:
        """Set annotations on a ResourceSlice in one merge patch; its spec and other annotations stay."""
        path = f"{RESOURCE_API}/resourceslices/{urllib.parse.quote(name)}"
        return await self._patch_metadata(path, {"annotations": annotations})

    async def delete_resource_slice(self, name: str, uid: str | None = None) -> None:
        """DELETE a ResourceSlice (only the object with `uid`, when given); absent is fine."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        with contextlib.suppress(NotFoundError):
            await self._call("DELETE", f"{RESOURCE_API}/resourceslices/{name}", body=body)

    async def watch_resource_slices(
        self, driver: str, node_name: str, resource_version: str, timeout_seconds: int = 300
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Yield (event type, object) for this driver's slices of the node until the server ends the watch.

        Raises KubeError with status 410 when the resourceVersion is too old: list again then.
        """
        async for event in self._watch(
            "ResourceSlices",
            f"{RESOURCE_API}/resourceslices",
            self._slice_selector(driver, node_name),
            resource_version,
            timeout_seconds,
        ):
            yield event

    async def watch_node(
        self, name: str, resource_version: str, timeout_seconds: int = 300
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Yield (event type, Node) for one Node until the server ends the watch (410: get it again)."""
        async for event in self._watch(
            "Node", "/api/v1/nodes", f"metadata.name={name}", resource_version, timeout_seconds
        ):
            yield event

    async def _watch(
        self, what: str, path: str, field_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, Obj]]:
        query = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "fieldSelector": field_selector,
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        target = f"{path}?{urllib.parse.urlencode(query)}"
        try:
            stream = await anyio.to_thread.run_sync(
                self._pool.stream, target, timeout_seconds + 10, abandon_on_cancel=True
            )
        except OSError as err:
            raise UnreachableError(f"watch {what} on {self.host} broke off: {_describe(err)}") from None
        try:
            if stream.status >= 400:
                body = await anyio.to_thread.run_sync(stream.read_all, abandon_on_cancel=True)
                raise _status_error(f"watch {what}: GET {path}", stream.status, body)
            # One event per line; a line (a slice of 128 devices) may span many reads.
            buffer = bytearray()
            while chunk := await anyio.to_thread.run_sync(stream.read, abandon_on_cancel=True):
                buffer += chunk
                if b"\n" not in chunk:  # the lines before it ended in earlier chunks
                    if len(buffer) > MAX_BODY:
                        raise KubeError(f"watch {what}: an event exceeds {MAX_BODY} bytes")
                    continue
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _event(what, line)
        except OSError as err:
            raise UnreachableError(f"watch {what} on {self.host} broke off: {_describe(err)}") from None
        finally:
            # Unblocks a read that a cancellation left waiting on its thread.
            stream.close()

    # -- events --------------------------------------------------------------

    async def create_event(
        self,
        involved: Obj,
        reason: str,
        message: str,
        *,
        host: str = "",
        event_type: str = "Warning",
    ) -> None:
        """Record a core/v1 Event about an object (kubectl describe shows it)."""
        await self._call("POST", *_event_object(involved, reason, message, host, event_type))

    def write_event(self, involved: Obj, reason: str, message: str, *, host: str = "") -> None:
        """Record a Warning event about an object from the calling thread: blocks it, never an event loop."""
        self._send("POST", *_event_object(involved, reason, message, host, "Warning"), None, _JSON)


def _event_object(involved: Obj, reason: str, message: str, host: str, event_type: str) -> tuple[str, Obj]:
    """Where a core/v1 Event about `involved` is created, and the Event."""
    meta = involved["metadata"]
    namespace = meta.get("namespace") or "default"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event: Obj = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"),
            "kind": involved.get("kind"),
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": "dra-gpu", "host": host},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    return f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/events", event
