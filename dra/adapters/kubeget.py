"""Blocking GETs to the API server for the prepare path: keep-alive HTTP/1.1, answers parsed by httptools.

A prepare runs on a worker thread (it waits on the checkpoint's fsync); reading its claim there
on a blocking socket keeps the request off the event loop and out of aiohttp's per-request
machinery. Transport only: dra.adapters.kube turns statuses and bodies into its errors and
objects. Why a second client, with the figures: docs/architecture.md, "Kubernetes client".
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable

import httptools

#: Idle connections kept for the next GET; the kubelet's calls rarely overlap by more.
MAX_IDLE = 8
#: The largest answer read: the API server stores objects of at most 1.5 MiB (etcd's request limit).
MAX_BODY = 8 << 20
#: The largest status line and headers read.
MAX_HEAD = 64 << 10


class HttpError(OSError):
    """The connection failed or the server's answer is not HTTP this client can read."""


class _Answer:
    """httptools' callbacks for one response: the body, bounded, and whether it is complete."""

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.size = 0
        self.headers_done = False
        self.done = False
        #: Whether the connection may carry the next request; httptools forgets once the message ends.
        self.keep_alive = False
        self.parser: httptools.HttpResponseParser | None = None
        #: Why a callback refused the answer (httptools reports only that a callback failed).
        self.refused: HttpError | None = None

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > MAX_BODY:
            self.refused = HttpError(f"the answer exceeds {MAX_BODY} bytes")
            raise self.refused
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()
        self.done = True


class BlockingPool:
    """Keep-alive connections to one API server, taken by one GET at a time; safe across threads."""

    def __init__(
        self,
        host: str,
        tls: ssl.SSLContext | None,
        authorization: Callable[[], str],
        tls_server_name: str = "",
        timeout: float = 10.0,
    ) -> None:
        """`host` is the server's URL (https://name:port or http://...), as a kubeconfig has it."""
        scheme, _, rest = host.partition("://")
        authority, slash, prefix = rest.partition("/")
        # A server URL may carry a path (an API server behind a proxy path): every request starts with it.
        self._prefix = (slash + prefix).rstrip("/")
        self._tls = tls if scheme == "https" else None
        if scheme == "https" and tls is None:
            self._tls = ssl.create_default_context()
        name, port = _split_authority(authority, 443 if scheme == "https" else 80)
        self._address = (name, port)
        self._server_name = tls_server_name or name
        self._authorization = authorization
        self._timeout = timeout
        self._head = f"Host: {authority}\r\nUser-Agent: dra-gpu\r\nAccept: application/json\r\n"
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    def get(self, path: str) -> tuple[int, bytes]:
        """GET `path`: the status and the body. HttpError (an OSError) when no answer came."""
        deadline = time.monotonic() + self._timeout
        token = self._authorization()
        authorization = f"Authorization: {token}\r\n" if token else ""
        request = f"GET {self._prefix}{path} HTTP/1.1\r\n{self._head}{authorization}\r\n".encode()
        pooled = self._take()
        if pooled is not None:
            try:
                return self._exchange(pooled, request, deadline, reused=True)
            except _StaleError:
                # The server closed a connection that waited in the pool: the GET is safe to repeat.
                pass
        return self._exchange(self._connect(deadline), request, deadline, reused=False)

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self) -> socket.socket | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def _give_back(self, conn: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self, deadline: float) -> socket.socket:
        try:
            conn = socket.create_connection(self._address, timeout=_left(deadline))
        except OSError as err:
            raise HttpError(f"cannot connect to {self._address[0]}:{self._address[1]}: {err}") from None
        try:
            # The request is one small write: sent now, not held back for an ACK (Nagle).
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_hostname=self._server_name)
        except (OSError, ValueError) as err:
            conn.close()
            raise HttpError(f"TLS to {self._server_name} failed: {err}") from None
        return conn

    def _exchange(
        self, conn: socket.socket, request: bytes, deadline: float, reused: bool
    ) -> tuple[int, bytes]:
        """Send the request and read the whole answer; the connection goes back to the pool or is closed."""
        answer = _Answer()
        parser = answer.parser = httptools.HttpResponseParser(answer)
        received = 0
        try:
            conn.settimeout(_left(deadline))
            conn.sendall(request)
            while not answer.done:
                conn.settimeout(_left(deadline))
                data = conn.recv(65536)
                if not data:
                    if not received and reused:
                        raise _StaleError("the server closed the connection before answering")
                    # The API server frames every answer (a length or chunks): an end before it is a cut.
                    raise HttpError("the server closed the connection in the middle of its answer")
                received += len(data)
                # The status line and headers are bounded here, by what came before they ended.
                if not answer.headers_done and received > MAX_HEAD:
                    raise HttpError(f"the answer's headers exceed {MAX_HEAD} bytes")
                parser.feed_data(data)
        except httptools.HttpParserError as err:
            conn.close()
            raise answer.refused or HttpError(f"the server's answer is not HTTP/1.1 ({err})") from None
        except TimeoutError:
            conn.close()
            raise HttpError(f"no answer within {self._timeout:g} s") from None
        except OSError as err:
            conn.close()
            if reused and not received and not isinstance(err, HttpError):
                # Reset or broken pipe on a connection the server had let go of while it waited.
                raise _StaleError(str(err)) from None
            raise
        if answer.keep_alive:
            self._give_back(conn)
        else:
            conn.close()
        return parser.get_status_code(), b"".join(answer.body)


class _StaleError(HttpError):
    """A pooled connection the server had closed; the request was not answered."""


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _split_authority(authority: str, default_port: int) -> tuple[str, int]:
    """A URL's host[:port], with IPv6 literals in brackets, as (host, port)."""
    if authority.startswith("["):
        name, _, rest = authority[1:].partition("]")
        return name, int(rest[1:]) if rest.startswith(":") else default_port
    name, colon, port = authority.rpartition(":")
    if not colon:
        return authority, default_port
    return name, int(port)
