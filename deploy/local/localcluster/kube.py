"""A small client for tests: any object as a plain dict, by apiVersion and kind.

Tests speak to the local cluster through this rather than through typed
models, so a manifest from docs/ or deploy/ is applied exactly as written.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import kubernetes
import yaml
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

Obj = dict[str, Any]
T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """A wait ran out; the message says what was awaited and what was last seen."""


class Kube:
    """Dynamic access to the cluster behind one kubeconfig."""

    def __init__(self, kubeconfig: str) -> None:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
        self.api_client = kubernetes.client.ApiClient(config)
        self.dynamic = DynamicClient(self.api_client)

    def close(self) -> None:
        """Release the connection pool."""
        self.api_client.close()

    def _resource(self, api_version: str, kind: str) -> Any:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj:
        """The object, or NotFoundError."""
        result: Obj = self._resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
        return result

    def get_or_none(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        """The object, or None when it does not exist."""
        try:
            return self.get(api_version, kind, name, namespace)
        except NotFoundError:
            return None

    def list_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> list[Obj]:
        """Every object of a kind, optionally in one namespace and filtered by selectors."""
        result = self._resource(api_version, kind).get(
            namespace=namespace, field_selector=field_selector, label_selector=label_selector
        )
        items: list[Obj] = result.to_dict()["items"]
        return items

    def create(self, obj: Obj, namespace: str | None = None, dry_run: bool = False) -> Obj:
        """Create an object; its namespace comes from metadata or the argument."""
        ns = obj.get("metadata", {}).get("namespace") or namespace
        kwargs: dict[str, Any] = {"body": obj, "namespace": ns}
        if dry_run:
            kwargs["query_params"] = [("dryRun", "All")]
        created: Obj = self._resource(obj["apiVersion"], obj["kind"]).create(**kwargs).to_dict()
        return created

    def create_all(self, docs: Iterable[Obj], namespace: str | None = None) -> list[Obj]:
        """Create several objects in order."""
        return [self.create(doc, namespace) for doc in docs]

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        status: bool = False,
    ) -> Obj:
        """A JSON merge patch (`None` removes a key), of the status subresource when `status`."""
        resource = self._resource(api_version, kind)
        if status:
            resource = resource.status
        patched: Obj = resource.patch(
            name=name, namespace=namespace, body=patch, content_type="application/merge-patch+json"
        ).to_dict()
        return patched

    def replace(self, obj: Obj) -> Obj:
        """PUT an object back (its resourceVersion decides conflicts)."""
        meta = obj["metadata"]
        replaced: Obj = (
            self._resource(obj["apiVersion"], obj["kind"])
            .replace(body=obj, name=meta["name"], namespace=meta.get("namespace"))
            .to_dict()
        )
        return replaced

    def replace_status(self, obj: Obj) -> Obj:
        """PUT an object's status subresource (e.g. a ResourceClaim's allocation)."""
        meta = obj["metadata"]
        resource = self._resource(obj["apiVersion"], obj["kind"]).status
        replaced: Obj = resource.replace(
            body=obj, name=meta["name"], namespace=meta.get("namespace")
        ).to_dict()
        return replaced

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        grace_period: int | None = None,
        propagation: str | None = None,
    ) -> None:
        """Delete if present.

        `propagation`: what happens to its dependents (Background, Foreground, Orphan); by default
        the resource's own policy, which orphans a Job's pods where `kubectl delete` would not.
        """
        options = {"gracePeriodSeconds": grace_period, "propagationPolicy": propagation}
        body = {k: v for k, v in options.items() if v is not None} or None
        with contextlib.suppress(NotFoundError):
            self._resource(api_version, kind).delete(name=name, namespace=namespace, body=body)

    def events_for(self, kind: str, name: str, namespace: str) -> list[Obj]:
        """Core events about one object, oldest first."""
        events = self.list_objects(
            "v1",
            "Event",
            namespace=namespace,
            field_selector=f"involvedObject.kind={kind},involvedObject.name={name}",
        )
        return _oldest_first(events)

    def wait_pod_phase(self, name: str, namespace: str, phase: str = "Running", timeout: float = 60.0) -> Obj:
        """Wait until a pod reaches a phase; the error lists its events."""

        def probe() -> Obj | None:
            pod = self.get("v1", "Pod", name, namespace)
            return pod if pod.get("status", {}).get("phase") == phase else None

        try:
            return wait_for(f"pod {namespace}/{name} to be {phase}", probe, timeout)
        except WaitTimeoutError as err:
            events = [_event_line(e) for e in self.events_for("Pod", name, namespace)]
            raise WaitTimeoutError(f"{err}\nevents:\n  " + "\n  ".join(events)) from None

    def wait_pods_running(self, namespace: str, expected: int, what: str, timeout: float = 90.0) -> list[Obj]:
        """Wait until the namespace has `expected` pods, all Running; the error says, for each pod
        that is not, its phase, why it waits and its events, and the namespace's other events."""

        def probe() -> list[Obj] | None:
            pods = self.list_objects("v1", "Pod", namespace=namespace)
            running = all(p.get("status", {}).get("phase") == "Running" for p in pods)
            return pods if len(pods) == expected and running else None

        try:
            return wait_for(what, probe, timeout)
        except WaitTimeoutError as err:
            raise WaitTimeoutError(f"{err}\n{self.describe_pods(namespace)}") from None

    def describe_pods(self, namespace: str) -> str:
        """The namespace's pods that do not run (phase, waiting reasons, events), its claims'
        allocations and its other events."""
        events = _oldest_first(self.list_objects("v1", "Event", namespace=namespace))
        pods = self.list_objects("v1", "Pod", namespace=namespace)
        lines = [f"{len(pods)} pods in {namespace}"]
        for pod in pods:
            status = pod.get("status", {})
            if status.get("phase") == "Running":
                continue
            name = pod["metadata"]["name"]
            why = [
                f"{c['type']}={c['status']} {c.get('reason', '')} {c.get('message', '')}".rstrip()
                for c in status.get("conditions") or []
                if c.get("status") != "True"
            ]
            for container in status.get("containerStatuses") or []:
                waiting = container.get("state", {}).get("waiting")
                if waiting:
                    why.append(f"{container['name']}: {waiting.get('reason')} {waiting.get('message', '')}")
            lines.append(f"pod {name}: {status.get('phase')}; {'; '.join(why)}")
            lines += [f"  {_event_line(e)}" for e in events if _about(e) == ("Pod", name)]
        for claim in self.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=namespace):
            results = ((claim.get("status", {}).get("allocation") or {}).get("devices") or {}).get(
                "results", []
            )
            held = [
                " ".join(
                    str(part)
                    for part in (f"{r['pool']}/{r['device']}", r.get("shareID"), r.get("consumedCapacity"))
                    if part
                )
                for r in results
            ]
            lines.append(f"claim {claim['metadata']['name']}: {', '.join(held) or 'not allocated'}")
        lines += [f"{' '.join(_about(e))}: {_event_line(e)}" for e in events if _about(e)[0] != "Pod"]
        return "\n".join(lines)


def _oldest_first(events: list[Obj]) -> list[Obj]:
    return sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def _about(event: Obj) -> tuple[str, str]:
    """The kind and name of the object an event is about."""
    involved = event.get("involvedObject") or {}
    return str(involved.get("kind")), str(involved.get("name"))


def _event_line(event: Obj) -> str:
    return f"{event.get('reason')}: {event.get('message')}"


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = 60.0,
    interval: float = 0.2,
) -> T:
    """Poll probe until it returns something other than None (or False)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
        except NotFoundError as err:
            value, last = None, err
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def load_manifests(text: str) -> list[Obj]:
    """Every non-empty YAML document of a multi-document string."""
    return [doc for doc in yaml.safe_load_all(text) if doc]
