"""Benchmark: which Kubernetes client the daemons' one async adapter should use.

    PYTHONPATH=deploy/local .venv/bin/python -m tests.bench.bench_kubeclient [--calls 300] [--concurrency 32]

Starts the local cluster and creates one ResourceClaim, then runs every
candidate in a fresh subprocess (this module with --worker) that measures:
the import time of the client library, resident memory after the import and
one client, GET latency of the claim (sequential, then `--concurrency` in
flight), and a watch from a listed resourceVersion that must see a create
(and whether the server's BOOKMARK came through). A candidate whose library
is not installed is skipped: `.venv/bin/pip install kubernetes_asyncio
lightkube httpx aiohttp` to measure them all. Prints figures, with ratios to
today's client; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import ssl
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

Obj = dict[str, Any]
JSON_HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}

# name: (what it is, the modules it needs)
CANDIDATES: dict[str, tuple[str, list[str]]] = {
    "kubernetes+threads": ("official kubernetes, sync, in anyio worker threads (before)", ["kubernetes"]),
    "kubernetes_asyncio": ("kubernetes_asyncio (aiohttp), raw call_api", ["kubernetes_asyncio"]),
    "lightkube": ("lightkube AsyncClient (httpx), generic resource", ["lightkube"]),
    "kubernetes+httpx": (
        "official kubernetes for the config, httpx.AsyncClient for calls",
        ["kubernetes", "httpx"],
    ),
    "kubernetes+aiohttp": (
        "official kubernetes for the config, aiohttp for calls",
        ["kubernetes", "aiohttp"],
    ),
    "adapter": ("dra.adapters.kube.KubeClient as it is now", ["dra.adapters.kube"]),
}
BASELINE = "kubernetes+threads"


def _rss_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


def _percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


class Candidate:
    """GET, POST and watch as each library does them; objects come back as plain dicts."""

    # Whether the watch can ask for BOOKMARK events (allowWatchBookmarks).
    bookmarks = True

    def __init__(self, mods: dict[str, Any], kubeconfig: str) -> None:
        self.mods = mods
        self.kubeconfig = kubeconfig

    async def open(self) -> None:
        """Build the client (load the kubeconfig, open no connection yet)."""

    async def get(self, path: str) -> Obj:
        """GET a path."""
        raise NotImplementedError

    async def post(self, path: str, body: Obj) -> Obj:
        """POST an object."""
        raise NotImplementedError

    def watch(self, path: str, query: dict[str, str]) -> AsyncIterator[tuple[str, Obj]]:
        """Watch events (type, object)."""
        raise NotImplementedError

    async def listed_version(self, collection: str) -> str:
        """The resourceVersion of a list of the collection (where a watch starts)."""
        return str((await self.get(collection))["metadata"]["resourceVersion"])

    async def aclose(self) -> None:
        """Release connections."""


def _official_config(kubernetes: Any, kubeconfig: str) -> Any:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
    return config


def _ssl_context(config: Any) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=config.ssl_ca_cert)
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    return context


def _lines(buffer: bytes, chunk: bytes) -> tuple[list[bytes], bytes]:
    buffer += chunk
    *lines, rest = buffer.split(b"\n")
    return [line for line in lines if line.strip()], rest


class OfficialThreads(Candidate):
    """Today's way: blocking call_api with _preload_content=False, one worker thread per call."""

    async def open(self) -> None:
        """Load the kubeconfig into an ApiClient."""
        kubernetes = self.mods["kubernetes"]
        config = _official_config(kubernetes, self.kubeconfig)
        config.retries = 0
        self.api = kubernetes.client.ApiClient(config)

    def _call(self, method: str, path: str, body: Obj | None = None, query: Any = None, **kw: Any) -> Any:
        return self.api.call_api(
            path,
            method,
            query_params=list((query or {}).items()),
            header_params=JSON_HEADERS,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=kw.get("timeout", 10),
        )[0]

    async def get(self, path: str) -> Obj:
        """GET in a worker thread."""
        response = await anyio.to_thread.run_sync(self._call, "GET", path)
        return dict(json.loads(response.data))

    async def post(self, path: str, body: Obj) -> Obj:
        """POST in a worker thread."""
        response = await anyio.to_thread.run_sync(lambda: self._call("POST", path, body))
        return dict(json.loads(response.data))

    async def watch(self, path: str, query: dict[str, str]) -> AsyncIterator[tuple[str, Obj]]:
        """Every chunk read in a worker thread, as the publisher's watch thread did."""
        response = await anyio.to_thread.run_sync(lambda: self._call("GET", path, query=query, timeout=30))
        chunks = response.stream(4096, decode_content=True)
        buffer = b""
        try:
            while chunk := await anyio.to_thread.run_sync(next, chunks, b""):
                lines, buffer = _lines(buffer, chunk)
                for line in lines:
                    event = json.loads(line)
                    yield event["type"], event["object"]
        finally:
            response.release_conn()

    async def aclose(self) -> None:
        """Close the pool."""
        self.api.close()


class KubernetesAsyncio(Candidate):
    """kubernetes_asyncio's generated ApiClient, raw (no model deserialisation)."""

    async def open(self) -> None:
        """Load the kubeconfig (a coroutine there) into an ApiClient."""
        k = self.mods["kubernetes_asyncio"]
        config = k.client.Configuration()
        await k.config.load_kube_config(config_file=self.kubeconfig, client_configuration=config)
        self.api = k.client.ApiClient(config)

    async def _call(self, method: str, path: str, body: Obj | None = None, query: Any = None) -> Any:
        return await self.api.call_api(
            path,
            method,
            query_params=list((query or {}).items()),
            header_params=dict(JSON_HEADERS),
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=10 if query is None else 30,
        )

    async def get(self, path: str) -> Obj:
        """GET, body read raw."""
        response = await self._call("GET", path)
        return dict(json.loads(await response.read()))

    async def post(self, path: str, body: Obj) -> Obj:
        """POST, body read raw."""
        response = await self._call("POST", path, body)
        return dict(json.loads(await response.read()))

    async def watch(self, path: str, query: dict[str, str]) -> AsyncIterator[tuple[str, Obj]]:
        """Lines of the streamed response."""
        response = await self._call("GET", path, query=query)
        try:
            async for line in response.content:
                if line.strip():
                    event = json.loads(line)
                    yield event["type"], event["object"]
        finally:
            response.release()

    async def aclose(self) -> None:
        """Close the aiohttp session."""
        await self.api.close()


class Lightkube(Candidate):
    """lightkube's AsyncClient on a generic ResourceClaim resource (dict-like objects)."""

    bookmarks = False

    async def open(self) -> None:
        """Load the kubeconfig into an AsyncClient."""
        lk = self.mods["lightkube"]
        generic = importlib.import_module("lightkube.generic_resource")
        self.claim = generic.create_namespaced_resource(
            "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"
        )
        self.client = lk.AsyncClient(config=lk.KubeConfig.from_file(self.kubeconfig), timeout=10)

    async def get(self, path: str) -> Obj:
        """GET by kind, namespace and name (the path is ours: /apis/.../namespaces/NS/resourceclaims/NAME)."""
        parts = path.split("/")
        obj = await self.client.get(self.claim, parts[-1], namespace=parts[-3])
        return dict(obj.to_dict())

    async def post(self, path: str, body: Obj) -> Obj:
        """Create from a dict."""
        obj = await self.client.create(self.claim.from_dict(body))
        return dict(obj.to_dict())

    async def watch(self, path: str, query: dict[str, str]) -> AsyncIterator[tuple[str, Obj]]:
        """lightkube's watch: no allowWatchBookmarks parameter, so no BOOKMARK reaches the caller."""
        namespace = path.split("/")[-2]
        async for kind, obj in self.client.watch(
            self.claim,
            namespace=namespace,
            resource_version=query["resourceVersion"],
            server_timeout=int(query["timeoutSeconds"]),
        ):
            yield kind, dict(obj.to_dict())

    async def listed_version(self, collection: str) -> str:
        """lightkube's list yields objects, not the list's resourceVersion: start after the bench claim's."""
        obj = await self.client.get(self.claim, "bench-claim", namespace=collection.split("/")[-2])
        return str(obj.metadata.resourceVersion)

    async def aclose(self) -> None:
        """Close the httpx client."""
        await self.client.close()


class OfficialHttpx(Candidate):
    """kubernetes only for the kubeconfig; httpx.AsyncClient for the calls."""

    async def open(self) -> None:
        """Load the kubeconfig; one AsyncClient with its TLS context."""
        self.config = _official_config(self.mods["kubernetes"], self.kubeconfig)
        self.http = self.mods["httpx"].AsyncClient(
            base_url=self.config.host, verify=_ssl_context(self.config), timeout=10
        )

    def _headers(self) -> dict[str, str]:
        token = self.config.get_api_key_with_prefix("authorization")
        return {**JSON_HEADERS, "Authorization": token} if token else JSON_HEADERS

    async def get(self, path: str) -> Obj:
        """GET."""
        response = await self.http.get(path, headers=self._headers())
        return dict(json.loads(response.content))

    async def post(self, path: str, body: Obj) -> Obj:
        """POST."""
        response = await self.http.post(path, content=json.dumps(body), headers=self._headers())
        return dict(json.loads(response.content))

    async def watch(self, path: str, query: dict[str, str]) -> AsyncIterator[tuple[str, Obj]]:
        """Lines of the streamed response."""
        async with self.http.stream(
            "GET", path, params=query, headers=self._headers(), timeout=30
        ) as response:
            async for line in response.aiter_lines():
                if line.strip():
                    event = json.loads(line)
                    yield event["type"], event["object"]

    async def aclose(self) -> None:
        """Close the pool."""
        await self.http.aclose()


class OfficialAiohttp(Candidate):
    """kubernetes only for the kubeconfig; one aiohttp.ClientSession for the calls."""

    async def open(self) -> None:
        """Load the kubeconfig; one session with its TLS context."""
        aiohttp = self.mods["aiohttp"]
        self.config = _official_config(self.mods["kubernetes"], self.kubeconfig)
        self.session = aiohttp.ClientSession(
            base_url=self.config.host,
            connector=aiohttp.TCPConnector(ssl=_ssl_context(self.config)),
            timeout=aiohttp.ClientTimeout(total=10),
        )

    def _headers(self) -> dict[str, str]:
        token = self.config.get_api_key_with_prefix("authorization")
        return {**JSON_HEADERS, "Authorization": token} if token else JSON_HEADERS

    async def get(self, path: str) -> Obj:
        """GET."""
        async with self.session.get(path, headers=self._headers()) as response:
            return dict(json.loads(await response.read()))

    async def post(self, path: str, body: Obj) -> Obj:
        """POST."""
        async with self.session.post(path, data=json.dumps(body), headers=self._headers()) as response:
            return dict(json.loads(await response.read()))

    async def watch(self, path: str, query: dict[str, str]) -> AsyncIterator[tuple[str, Obj]]:
        """Lines of the streamed response."""
        timeout = self.mods["aiohttp"].ClientTimeout(total=30)
        async with self.session.get(path, params=query, headers=self._headers(), timeout=timeout) as response:
            async for line in response.content:
                if line.strip():
                    event = json.loads(line)
                    yield event["type"], event["object"]

    async def aclose(self) -> None:
        """Close the session."""
        await self.session.close()


class Adapter(Candidate):
    """The project's own adapter, whatever it is at this commit (sync methods go to a worker thread)."""

    async def open(self) -> None:
        """Construct the KubeClient."""
        self.client = self.mods["dra.adapters.kube"].KubeClient(self.kubeconfig)

    async def get(self, path: str) -> Obj:
        """get_resource_claim."""
        parts = path.split("/")
        return dict(await self._run(self.client.get_resource_claim, parts[-3], parts[-1]))

    async def _run(self, method: Callable[..., Any], *args: Any) -> Any:
        result = method(*args)
        if isinstance(result, Awaitable):
            return await result
        return await anyio.to_thread.run_sync(method, *args)

    async def post(self, path: str, body: Obj) -> Obj:
        """Not used: the adapter creates no claims."""
        raise NotImplementedError

    async def listed_version(self, collection: str) -> str:
        """Not measured: the adapter watches ResourceSlices only (the driver benchmark covers it)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """aclose() or close()."""
        closing = getattr(self.client, "aclose", None)
        if closing is not None:
            await closing()
        else:
            self.client.close()


IMPLEMENTATIONS: dict[str, type[Candidate]] = {
    "kubernetes+threads": OfficialThreads,
    "kubernetes_asyncio": KubernetesAsyncio,
    "lightkube": Lightkube,
    "kubernetes+httpx": OfficialHttpx,
    "kubernetes+aiohttp": OfficialAiohttp,
    "adapter": Adapter,
}


async def _measure(client: Candidate, claim_path: str, calls: int, concurrency: int) -> Obj:
    figures: Obj = {}
    await client.open()
    await client.get(claim_path)
    figures["rss_kib"] = _rss_kib()

    sequential = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await client.get(claim_path)
        sequential.append((time.perf_counter() - t0) * 1000)
    figures["seq_ms"] = sequential

    concurrent: list[float] = []
    limiter = anyio.Semaphore(concurrency)

    async def one() -> None:
        async with limiter:
            t0 = time.perf_counter()
            await client.get(claim_path)
            concurrent.append((time.perf_counter() - t0) * 1000)

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(calls):
            group.start_soon(one)
    figures["conc_ms"] = concurrent
    figures["conc_per_s"] = calls / (time.perf_counter() - started)
    figures["rss_after_kib"] = _rss_kib()
    return figures


async def _watch(client: Candidate, namespace: str) -> Obj:
    """List, watch from the list's resourceVersion, create a claim: the ADDED event must arrive."""
    collection = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    try:
        version = await client.listed_version(collection)
    except NotImplementedError:
        return {"watch": "not measured"}
    query = {
        "watch": "1",
        "allowWatchBookmarks": "true",
        "resourceVersion": version,
        "timeoutSeconds": "4",
    }
    name = f"watched-{uuid.uuid4().hex[:6]}"
    seen: list[str] = []
    created_at = 0.0
    added_after = -1.0

    async def create() -> None:
        nonlocal created_at
        await anyio.sleep(0.5)
        created_at = time.perf_counter()
        await client.post(collection, _claim(name, namespace))

    try:
        with anyio.fail_after(15):
            async with anyio.create_task_group() as group:
                group.start_soon(create)
                async for kind, obj in client.watch(collection, query):
                    seen.append(kind)
                    if kind == "ADDED" and obj["metadata"]["name"] == name:
                        added_after = (time.perf_counter() - created_at) * 1000
                    # The server sends its BOOKMARK shortly before timeoutSeconds ends the watch.
                    if added_after >= 0 and (kind == "BOOKMARK" or not client.bookmarks):
                        break
    except (TimeoutError, NotImplementedError) as err:
        return {"watch": f"failed: {err!r}", "events": seen}
    return {
        "watch": "yes" if added_after >= 0 else "no ADDED event",
        "bookmark": "BOOKMARK" in seen,
        "event_ms": added_after,
        "events": seen,
    }


def _claim(name: str, namespace: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "any"}}]}},
    }


def worker(args: argparse.Namespace) -> None:
    """In a fresh interpreter: import, build, measure; print the figures as one JSON line."""
    rss_before = _rss_kib()
    started = time.perf_counter()
    mods = {name: importlib.import_module(name) for name in CANDIDATES[args.worker][1]}
    import_ms = (time.perf_counter() - started) * 1000
    client = IMPLEMENTATIONS[args.worker](mods, args.kubeconfig)
    claim_path = f"/apis/resource.k8s.io/v1/namespaces/{args.namespace}/resourceclaims/{args.claim}"

    async def main() -> Obj:
        try:
            figures = await _measure(client, claim_path, args.calls, args.concurrency)
            figures.update(await _watch(client, args.namespace))
            return figures
        finally:
            await client.aclose()

    figures = anyio.run(main)
    figures.update(import_ms=import_ms, rss_before_kib=rss_before)
    print(json.dumps(figures))


def _run_worker(
    name: str, kubeconfig: str, namespace: str, claim: str, args: argparse.Namespace
) -> Obj | str:
    missing = [m for m in CANDIDATES[name][1] if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing:
        return f"skipped: {', '.join(missing)} not installed"
    command = [sys.executable, "-m", "tests.bench.bench_kubeclient", "--worker", name]
    command += ["--kubeconfig", kubeconfig, "--namespace", namespace, "--claim", claim]
    command += ["--calls", str(args.calls), "--concurrency", str(args.concurrency)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _merge(runs: list[Obj | str]) -> Obj | str:
    """Rounds pooled: latency samples together, the median of the single figures, the last watch."""
    done = [run for run in runs if isinstance(run, dict)]
    if not done:
        return runs[-1]
    merged = dict(done[-1])
    for key in ("seq_ms", "conc_ms"):
        merged[key] = [sample for run in done for sample in run[key]]
    for key in ("import_ms", "rss_kib", "rss_before_kib", "conc_per_s"):
        merged[key] = statistics.median(run[key] for run in done)
    merged["rounds"] = len(done)
    return merged


def _ratio(value: float, base: float | None) -> str:
    return f"  ({value / base:.2f}x before)" if base else ""


def report(results: dict[str, Obj | str], calls: int, concurrency: int) -> None:
    """One line per figure, with the ratio to today's client."""
    base = results.get(BASELINE)
    base = base if isinstance(base, dict) else None
    for name, figures in results.items():
        print(f"{name}: {CANDIDATES[name][0]}")
        if isinstance(figures, str):
            print(f"  {figures}")
            continue

        def line(label: str, key: str, value: float, unit: str, figures: Obj = figures) -> None:
            reference = None
            if base is not None and figures is not base:
                reference = _figure(base, key)
            print(f"  {label}: {value:.2f} {unit}{_ratio(value, reference)}")

        line("import (median of rounds)", "import_ms", figures["import_ms"], "ms")
        line("RSS after import + client + 1 GET", "rss_kib", figures["rss_kib"] / 1024, "MiB")
        line("  of which the library and client", "rss_delta", _figure(figures, "rss_delta"), "MiB")
        for key, label in (
            ("seq_ms", f"GET sequential (n={calls})"),
            ("conc_ms", f"GET {concurrency} in flight"),
        ):
            for pct in (50, 99):
                line(f"{label} p{pct}", f"{key}.{pct}", _percentile(figures[key], pct), "ms")
        line(f"GETs/s with {concurrency} in flight", "conc_per_s", figures["conc_per_s"], "/s")
        watch = figures.get("watch")
        if watch == "yes":
            print(
                f"  watch from a listed resourceVersion: yes, event {figures['event_ms']:.1f} ms after the "
                f"create; BOOKMARK {'received' if figures['bookmark'] else 'not received'}"
            )
        else:
            print(f"  watch: {watch} {figures.get('events', '')}")


def _figure(figures: Obj, key: str) -> float:
    if key == "rss_delta":
        return float(figures["rss_kib"] - figures["rss_before_kib"]) / 1024
    if key == "rss_kib":
        return float(figures["rss_kib"]) / 1024
    if "." in key:
        name, pct = key.split(".")
        return _percentile(figures[name], float(pct))
    return float(figures[key])


def main() -> None:
    """Start the cluster, run every candidate, print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per candidate")
    parser.add_argument("--only", nargs="*", choices=sorted(CANDIDATES), help="measure only these")
    parser.add_argument("--worker", choices=sorted(CANDIDATES), help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--claim", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    # Here, not at the top: the harness imports kubernetes, which would spoil the workers' import times.
    from localcluster.cluster import running_cluster
    from localcluster.kube import Kube

    with running_cluster() as cluster:
        kube = Kube(cluster.kubeconfig)
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        kube.create(_claim("bench-claim", namespace))
        names = args.only or list(CANDIDATES)
        runs: dict[str, list[Obj | str]] = {name: [] for name in names}
        load = os.getloadavg()[0]
        # Round-robin, so that a noisy minute on the shared machine hits every candidate alike.
        for _ in range(args.rounds):
            for name in names:
                runs[name].append(_run_worker(name, cluster.kubeconfig, namespace, "bench-claim", args))
        kube.delete("v1", "Namespace", namespace)
        kube.close()
    print(
        f"{args.rounds} rounds of {args.calls} GETs per candidate; load average {load:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs"
    )
    report({name: _merge(runs[name]) for name in names}, args.calls * args.rounds, args.concurrency)


if __name__ == "__main__":
    main()
