"""`dra-gpu webhook`: AdmissionReviews over HTTPS (POST /validate), probes and metrics beside it.

The serving certificate comes from files (a mounted Secret) and is reloaded when their
contents change, so a rotated Secret is picked up without a restart; a pair that does not
load (a half-written rotation) is logged and the old one kept. The decisions are
dra.webhook.admission's; this module only carries them.
"""

from __future__ import annotations

import logging
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
from aiohttp import web

from dra import __version__, documents
from dra.adapters import tlsfiles
from dra.daemon import metrics
from dra.daemon.bootstrap import StartupError, serve_http
from dra.daemon.lifecycle import Heartbeat, until_stopped
from dra.model.quoting import quote
from dra.webhook.admission import CONFIG_PATHS, ReviewError, review

log = logging.getLogger(__name__)

#: Bodies larger than this are refused: an AdmissionReview of the largest object etcd stores fits.
MAX_BODY_BYTES = 8 * 2**20
#: Seconds a client has to send its body once the headers are in. The API server sends a review
#: at once; without a limit, clients that stop half-way would hold connections and memory forever.
BODY_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class WebhookSettings:
    """What `dra-gpu webhook` is told."""

    driver_name: str
    #: host:port of the HTTPS listener (":8443": every address).
    bind_address: str
    tls_cert_file: Path
    tls_key_file: Path
    #: host:port for /metrics, /healthz and /readyz; None disables.
    http_address: str | None = None
    #: Seconds between looks at the certificate files; 0 never looks again.
    tls_reload_interval: float = 10.0


class Certificates:
    """One server SSLContext whose certificate and key are replaced in place when the files change.

    Connections accepted after a reload get the new pair; open ones keep theirs.
    """

    def __init__(self, cert: Path, key: Path) -> None:
        self._cert, self._key = cert, key
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            self._seen = self._contents()
        except documents.DocumentError as err:
            raise StartupError(str(err)) from None
        error = load_pair(self.context, self._seen)
        if error is not None:
            raise StartupError(f"cannot load --tls-cert-file {cert} and --tls-key-file {key}: {error}")

    def _contents(self) -> tuple[bytes, bytes]:
        """Both files' bytes, through the bounded reader; DocumentError naming the one that is not a file."""
        return (
            documents.read_file(self._cert, "--tls-cert-file"),
            documents.read_file(self._key, "--tls-key-file"),
        )

    def reload_if_changed(self) -> bool | None:
        """Reload when the files changed: True when reloaded, False when that failed, None when unchanged."""
        try:
            contents = self._contents()
        except documents.DocumentError:
            # Mid-rotation (a file missing, or swapped for something else): look again next time.
            return None
        if contents == self._seen:
            return None
        self._seen = contents
        error = load_pair(self.context, contents)
        if error is not None:
            log.error("serving certificate changed but does not load, keeping the old one: %s", error)
            metrics.WEBHOOK_CERT_RELOADS.labels("failed").inc()
            return False
        log.info("serving certificate reloaded from %s", self._cert)
        metrics.WEBHOOK_CERT_RELOADS.labels("reloaded").inc()
        return True

    async def watch(self, interval: float) -> None:
        """Reload on change every `interval` seconds, until cancelled; never with 0."""
        while interval > 0:
            await anyio.sleep(interval)
            self.reload_if_changed()


def load_pair(context: ssl.SSLContext, pair: tuple[bytes, bytes]) -> str | None:
    """Load a certificate chain and key (PEM bytes) into `context`; why not, or None when they load.

    A trial load into a scratch context first, so that a pair that does not match never leaves
    `context` half-replaced.
    """
    try:
        tlsfiles.load_cert_chain(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), *pair)
        tlsfiles.load_cert_chain(context, *pair)
    except (OSError, ssl.SSLError) as err:
        return str(err)
    return None


def _bad_request(status: int, reason: str) -> web.Response:
    metrics.WEBHOOK_REVIEWS.labels("", "error").inc()
    return web.json_response({"error": reason}, status=status)


def application(driver: str, body_timeout: float = BODY_TIMEOUT_SECONDS) -> web.Application:
    """The HTTP application: POST /validate.

    Every request that is not a well-formed AdmissionReview gets a 4xx with the reason
    (wrong Content-Type 415, a body not sent in time 408, anything else 400), never a 500.
    """

    async def validate(request: web.Request) -> web.Response:
        started = time.perf_counter()
        if request.content_type != "application/json":
            return _bad_request(
                415, f"expected Content-Type application/json, got {quote(request.content_type)}"
            )
        try:
            with anyio.fail_after(body_timeout):
                data = await request.read()
        except TimeoutError:
            refusal = _bad_request(408, f"the body did not arrive within {body_timeout:g} s")
            # The rest of the body may never come: keeping the connection would keep the client.
            refusal.force_close()
            return refusal
        except ConnectionError as err:
            # The client went away (or timed out on its side) mid-body: nobody reads an answer.
            log.info("client %s closed the connection before sending its body: %s", request.remote, err)
            return _bad_request(400, "connection closed mid-body")
        try:
            answer, verdict = review(documents.load_json(data, "the request body", MAX_BODY_BYTES), driver)
        except (ReviewError, documents.DocumentError) as err:
            return _bad_request(400, str(err))
        metrics.WEBHOOK_REVIEW_SECONDS.observe(time.perf_counter() - started)
        kind = verdict.kind if verdict.kind in CONFIG_PATHS else "other"
        metrics.WEBHOOK_REVIEWS.labels(kind, "allowed" if verdict.allowed else "denied").inc()
        if not verdict.allowed:
            log.info("denied %s: %s", verdict.kind, "; ".join(verdict.problems))
        return web.json_response(answer)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/validate", validate)
    return app


async def run_webhook(settings: WebhookSettings) -> None:
    """Serve until SIGTERM or SIGINT."""
    certificates = Certificates(settings.tls_cert_file, settings.tls_key_file)
    host, _, port = settings.bind_address.rpartition(":")
    runner = web.AppRunner(application(settings.driver_name), access_log=None)
    await runner.setup()
    heartbeat = Heartbeat()
    listening = False
    http = None
    try:
        site = web.TCPSite(runner, host or None, int(port), ssl_context=certificates.context)
        try:
            await site.start()
        except OSError as err:
            raise StartupError(
                f"cannot serve HTTPS on --bind-address {settings.bind_address!r}: {err}"
            ) from None
        listening = True
        if settings.http_address:
            http = serve_http(
                settings.http_address, lambda: listening, heartbeat.alive, registry=metrics.WEBHOOK_REGISTRY
            )
        log.info(
            "dra-gpu %s ready: validating %s configs on https://%s/validate",
            __version__,
            settings.driver_name,
            settings.bind_address,
        )
        async with anyio.create_task_group() as group:
            group.start_soon(heartbeat.run)
            group.start_soon(certificates.watch, settings.tls_reload_interval)
            await until_stopped()
            group.cancel_scope.cancel()
    finally:
        listening = False
        if http is not None:
            http.shutdown()
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
