"""The Kubernetes API adapter: the only module that imports the kubernetes client library.

Objects travel as plain JSON dicts, exactly as the API server sends them, so
the pure modules (claims, slices) work on the documented wire format and tests
can feed them literal manifests. Every call is blocking; async callers run
them in worker threads. Failures become KubeError subclasses that say which
object and what the API server answered.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import urllib.parse
from collections.abc import Iterator
from typing import Any

import kubernetes
import urllib3

log = logging.getLogger(__name__)

Obj = dict[str, Any]

RESOURCE_API = "/apis/resource.k8s.io/v1"


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
    return str(message) if message else str(body or "")[:200]


class KubeClient:
    """A connection to one API server, from a kubeconfig file or the in-cluster service account."""

    def __init__(self, kubeconfig: str | None = None, timeout: float = 10.0) -> None:
        config = kubernetes.client.Configuration()
        try:
            if kubeconfig:
                kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
            else:
                kubernetes.config.load_incluster_config(client_configuration=config)
        except (kubernetes.config.ConfigException, OSError) as err:
            where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
            raise KubeError(f"cannot load Kubernetes credentials from {where}: {err}") from err
        # Fail fast: the kubelet gives a prepare call about 45 s, and callers retry on their own.
        config.retries = 0
        self.host = str(config.host)
        self._timeout = timeout
        self._api = kubernetes.client.ApiClient(config)

    def close(self) -> None:
        """Release connections."""
        self._api.close()

    def _call(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        query: dict[str, str] | None = None,
        stream: bool = False,
        timeout: float | None = None,
    ) -> Any:
        what = f"{method} {path}"
        try:
            response = self._api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout or self._timeout,
            )[0]
            if stream:
                return response
            # The body is read inside the try: a connection lost mid-body is the same failure
            # as one lost before it.
            return json.loads(response.data or b"{}")
        except kubernetes.client.ApiException as err:
            status = int(err.status or 0)
            message = f"{what}: {status} {_reason(err.body)}"
            if status == 404:
                raise NotFoundError(message, status) from None
            if status == 409:
                raise ConflictError(message, status) from None
            if status == 0:
                raise UnreachableError(f"{what}: {err.reason}") from None
            raise KubeError(message, status) from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise UnreachableError(f"API server {self.host} unreachable ({what}): {err}") from None
        except ValueError as err:
            raise KubeError(f"{what}: the API server's answer is not JSON ({err})") from None

    # -- reads ---------------------------------------------------------------

    def get_resource_claim(self, namespace: str, name: str) -> Obj:
        """GET a ResourceClaim (resource.k8s.io/v1)."""
        result: Obj = self._call("GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")
        return result

    def get_node(self, name: str) -> Obj:
        """GET a Node."""
        result: Obj = self._call("GET", f"/api/v1/nodes/{name}")
        return result

    def get_device_class(self, name: str) -> Obj:
        """GET a DeviceClass."""
        result: Obj = self._call("GET", f"{RESOURCE_API}/deviceclasses/{name}")
        return result

    def list_resource_claims(self) -> list[Obj]:
        """Every ResourceClaim of the cluster (to see which devices are allocated)."""
        return list(self._call("GET", f"{RESOURCE_API}/resourceclaims").get("items") or [])

    def list_node_resource_slices(self, node_name: str) -> list[Obj]:
        """The ResourceSlices of every driver on one node."""
        result = self._call(
            "GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={node_name}"}
        )
        return list(result.get("items") or [])

    # -- ResourceSlices ------------------------------------------------------

    @staticmethod
    def _slice_selector(driver: str, node_name: str) -> str:
        return f"spec.driver={driver},spec.nodeName={node_name}"

    def list_resource_slices(self, driver: str, node_name: str) -> tuple[list[Obj], str]:
        """This driver's slices of one node, and the list's resourceVersion (for a watch)."""
        result = self._call(
            "GET",
            f"{RESOURCE_API}/resourceslices",
            query={"fieldSelector": self._slice_selector(driver, node_name)},
        )
        return list(result.get("items") or []), str(result["metadata"].get("resourceVersion", ""))

    def create_resource_slice(self, obj: Obj) -> Obj:
        """POST a ResourceSlice."""
        result: Obj = self._call("POST", f"{RESOURCE_API}/resourceslices", body=obj)
        return result

    def replace_resource_slice(self, obj: Obj) -> Obj:
        """PUT a ResourceSlice; its metadata.resourceVersion guards against lost updates."""
        name = obj["metadata"]["name"]
        result: Obj = self._call("PUT", f"{RESOURCE_API}/resourceslices/{name}", body=obj)
        return result

    def delete_resource_slice(self, name: str, uid: str | None = None) -> None:
        """DELETE a ResourceSlice (only the object with `uid`, when given); absent is fine."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        with contextlib.suppress(NotFoundError):
            self._call("DELETE", f"{RESOURCE_API}/resourceslices/{name}", body=body)

    def watch_resource_slices(
        self, driver: str, node_name: str, resource_version: str, timeout_seconds: int = 300
    ) -> Iterator[tuple[str, Obj]]:
        """Yield (event type, object) for this driver's slices of the node until the server ends the watch.

        Raises KubeError with status 410 when the resourceVersion is too old: list again then.
        """
        query = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "fieldSelector": self._slice_selector(driver, node_name),
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
        }
        response = self._call(
            "GET", f"{RESOURCE_API}/resourceslices", query=query, stream=True, timeout=timeout_seconds + 10
        )
        try:
            buffer = b""
            for chunk in response.stream(4096, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object", {})
                        raise KubeError(
                            f"watch ResourceSlices: {status.get('message')}", int(status.get("code", 0))
                        )
                    yield str(event["type"]), event["object"]
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise UnreachableError(f"watch ResourceSlices on {self.host} broke off: {err}") from None
        except (ValueError, KeyError) as err:
            raise KubeError(
                f"watch ResourceSlices: an event is not what the API server sends ({err!r})"
            ) from None
        finally:
            response.release_conn()

    # -- events --------------------------------------------------------------

    def create_event(
        self,
        involved: Obj,
        reason: str,
        message: str,
        *,
        host: str = "",
        event_type: str = "Warning",
    ) -> None:
        """Record a core/v1 Event about an object (kubectl describe shows it)."""
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
        self._call("POST", f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/events", body=event)
