"""Blocking HTTP/1.1 to the API server for every call of dra.adapters.kube, answers parsed by httptools.

Keep-alive connections in a small pool for requests; a connection of its own for each watch,
read as a stream. dra.adapters.kube runs these on worker threads (the prepare's claim GET on the
thread that already runs the prepare) and turns statuses and bodies into its errors and objects:
this module is transport only. Why a client of our own, with the figures: docs/architecture.md,
"Kubernetes client".
"""

from __future__ import annotations

import base64
import contextlib
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable

import httptools

#: Idle connections kept for the next request; the daemons' calls rarely overlap by more.
MAX_IDLE = 8
#: The largest answer read (and, for a stream, the most read ahead of its reader): the API server
#: stores objects of at most 1.5 MiB (etcd's request limit).
MAX_BODY = 8 << 20
#: The largest status line and headers read.
MAX_HEAD = 64 << 10
#: Requests sent again on a new connection when a kept one turns out closed before any answer:
#: the idempotent ones (every PATCH here is a merge patch or a server-side apply: sent twice, the
#: object ends the same). A POST creates, so it is never repeated; a kept connection is checked for
#: the server's close before anything is sent on it, which is how a POST meets one.
_REPLAYABLE = frozenset({"GET", "PUT", "DELETE", "PATCH"})


class HttpError(OSError):
    """The connection failed or the server's answer is not HTTP this client can read."""


class _StaleError(HttpError):
    """A kept connection the server had closed; the request was not answered."""


class _Answer:
    """httptools' callbacks for one response: its body, bounded, and whether it is complete."""

    def __init__(self, limit: int) -> None:
        self.body: list[bytes] = []
        #: Body bytes held (for a stream, those its reader has not taken yet).
        self.size = 0
        self.limit = limit
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
        if self.size > self.limit:
            self.refused = HttpError(f"the answer exceeds {self.limit} bytes")
            raise self.refused
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()
        self.done = True

    def take(self) -> bytes:
        data = b"".join(self.body)
        self.body.clear()
        self.size = 0
        return data


class _Exchange:
    """One request's answer as it arrives on one connection, read before a deadline."""

    def __init__(self, conn: socket.socket, deadline: float, timeout: float, limit: int) -> None:
        self.conn = conn
        self.answer = _Answer(limit)
        self.parser = self.answer.parser = httptools.HttpResponseParser(self.answer)
        self.received = 0
        self._deadline = deadline
        self._timeout = timeout

    def send(self, request: bytes) -> None:
        try:
            self.conn.settimeout(_left(self._deadline, self._timeout))
            self.conn.sendall(request)
        except TimeoutError:
            raise HttpError(f"no answer within {self._timeout:g} s") from None

    def receive(self, reused: bool = False) -> None:
        """Read once and parse what came; HttpError (an OSError) for a cut, a timeout or not HTTP."""
        try:
            self.conn.settimeout(_left(self._deadline, self._timeout))
            data = self.conn.recv(65536)
            if not data:
                if not self.received:
                    if reused:
                        raise _StaleError("the server closed the connection before answering")
                    raise HttpError("the server closed the connection without answering")
                # The API server frames every answer (a length or chunks): an end before it is a cut.
                raise HttpError("the server closed the connection in the middle of its answer")
            self.received += len(data)
            # The status line and headers are bounded here, by what came before they ended.
            if not self.answer.headers_done and self.received > MAX_HEAD:
                raise HttpError(f"the answer's headers exceed {MAX_HEAD} bytes")
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            raise self.answer.refused or HttpError(f"the server's answer is not HTTP/1.1 ({err})") from None
        except TimeoutError:
            raise HttpError(f"no answer within {self._timeout:g} s") from None


class Stream:
    """A streamed answer (a watch) on a connection of its own; `close()` ends it from any thread."""

    def __init__(self, exchange: _Exchange, release: Callable[[socket.socket, bool], None]) -> None:
        self._exchange = exchange
        self._release = release
        #: The HTTP status; the headers have arrived when the stream is handed out.
        self.status: int = exchange.parser.get_status_code()

    def read(self) -> bytes:
        """The body's next bytes as they come; b"" once it has ended. HttpError when it breaks off."""
        answer = self._exchange.answer
        while not answer.body and not answer.done:
            self._exchange.receive()
        return answer.take()

    def read_all(self) -> bytes:
        """The rest of the body (an error's Status), bounded as every answer is."""
        parts, size = [], 0
        while chunk := self.read():
            size += len(chunk)
            if size > MAX_BODY:
                raise HttpError(f"the answer exceeds {MAX_BODY} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        """Close the connection; a read blocked on it in another thread returns."""
        conn = self._exchange.conn
        _cut(conn)
        self._release(conn, False)


class _Proxy:
    """An HTTP proxy from a kubeconfig's proxy-url: its address and the header that authorises us."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"proxy-url {url!r}: only http:// proxies are supported")
        self.address = (parts.hostname, parts.port or 80)
        self.header = ""
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.header = f"Proxy-Authorization: Basic {token}\r\n"


class BlockingPool:
    """Keep-alive connections to one API server, each taken by one request at a time; safe across threads."""

    def __init__(
        self,
        host: str,
        tls: ssl.SSLContext | None,
        authorization: Callable[[], str],
        tls_server_name: str = "",
        timeout: float = 10.0,
        proxy: str = "",
    ) -> None:
        """`host` is the server's URL (https://name:port or http://...), as a kubeconfig has it.

        `proxy`: an http:// proxy URL (a kubeconfig's proxy-url); ValueError for any other kind.
        """
        scheme, _, rest = host.partition("://")
        authority, slash, prefix = rest.partition("/")
        # A server URL may carry a path (an API server behind a proxy path): every request starts with it.
        self._prefix = (slash + prefix).rstrip("/")
        self._tls = tls if scheme == "https" else None
        if scheme == "https" and tls is None:
            self._tls = ssl.create_default_context()
        name, port = _split_authority(authority, 443 if scheme == "https" else 80)
        self._address = (name, port)
        self._authority = authority
        self._server_name = tls_server_name or name
        self._authorization = authorization
        self._timeout = timeout
        self._proxy = _Proxy(proxy) if proxy else None
        # Through a proxy, plain HTTP asks for the absolute URL; HTTPS goes through a CONNECT tunnel.
        plain_proxy = self._proxy if self._proxy is not None and self._tls is None else None
        self._origin = f"http://{authority}" if plain_proxy is not None else ""
        proxy_header = plain_proxy.header if plain_proxy is not None else ""
        self._head = f"Host: {authority}\r\nUser-Agent: dra-gpu\r\nAccept: application/json\r\n{proxy_header}"
        self._idle: list[socket.socket] = []
        #: Connections carrying a request now: close() cuts them, so no thread waits out its deadline.
        self._busy: set[socket.socket] = set()
        self._closed = False
        self._lock = threading.Lock()

    def request(
        self, method: str, target: str, body: bytes | None = None, content_type: str = ""
    ) -> tuple[int, bytes]:
        """`method` `target` (a path and query), with `body`: the status and the body of the answer.

        HttpError (an OSError) when no answer came within the pool's timeout.
        """
        deadline = time.monotonic() + self._timeout
        request = self._request(method, target, body, content_type)
        replayable = method in _REPLAYABLE
        pooled = self._take(check=not replayable)
        if pooled is not None:
            try:
                return self._exchange(pooled, request, deadline, reused=replayable)
            except _StaleError:
                pass  # not answered: the request is safe to send again
        return self._exchange(self._connect(deadline), request, deadline, reused=False)

    def stream(self, target: str, timeout: float) -> Stream:
        """GET `target` on a new connection and return once the answer's headers are in."""
        deadline = time.monotonic() + timeout
        conn = self._connect(deadline)
        exchange = _Exchange(conn, deadline, timeout, MAX_BODY)
        try:
            exchange.send(self._request("GET", target, None, ""))
            while not exchange.answer.headers_done:
                exchange.receive()
        except OSError:
            self._done(conn, keep=False)
            raise
        return Stream(exchange, self._done)

    def open_idle(self) -> int:
        """Open connections until MAX_IDLE are idle; how many it opened (HttpError: the first failure).

        Concurrent requests each need a connection: a burst of prepares after start-up would
        otherwise open them, a TLS handshake each on both sides, inside the burst. The API server
        closes one idle for 90 s; a request meets it closed and opens another, as for any kept one.
        """
        with self._lock:
            missing = MAX_IDLE - len(self._idle)
        opened = []
        try:
            for _ in range(missing):
                opened.append(self._connect(time.monotonic() + self._timeout))
        finally:
            for conn in opened:
                self._done(conn, keep=True)
        return len(opened)

    def close(self) -> None:
        """Close the idle connections and cut those carrying a request (its caller gets an HttpError).

        A cancelled call leaves its request running on its thread; at shutdown this ends it at once
        instead of at its deadline. Later requests fail.
        """
        with self._lock:
            idle, self._idle = self._idle, []
            busy = list(self._busy)
            self._closed = True
        for conn in idle:
            conn.close()
        for conn in busy:
            _cut(conn)

    def _request(self, method: str, target: str, body: bytes | None, content_type: str) -> bytes:
        token = self._authorization()
        head = f"{method} {self._origin}{self._prefix}{target} HTTP/1.1\r\n{self._head}"
        if token:
            head += f"Authorization: {token}\r\n"
        if body is None:
            return f"{head}\r\n".encode()
        return f"{head}Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body

    def _take(self, check: bool) -> socket.socket | None:
        """A kept connection; `check`: one the server has not closed, for a request never sent twice.

        The others meet a closed one as a _StaleError and go again on a new connection: the check's
        select is a system call per request, and a switch of threads wherever another waits for the GIL.
        """
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn = self._idle.pop()
                self._busy.add(conn)
            if not (check and _closed_by_peer(conn)):
                return conn
            self._done(conn, keep=False)

    def _done(self, conn: socket.socket, keep: bool) -> None:
        """A request's connection back to the pool (`keep`, while there is room) or closed."""
        with self._lock:
            self._busy.discard(conn)
            if keep and not self._closed and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self, deadline: float) -> socket.socket:
        """A new connection, counted busy until `_done`."""
        # A closed client opens nothing: a connection (and its TLS handshake) that would be dropped
        # at once costs the API server, and reaches a server that may be shutting down.
        if self._closed:
            raise HttpError("the client is closed")
        address = self._proxy.address if self._proxy is not None else self._address
        try:
            conn = socket.create_connection(address, timeout=_left(deadline, self._timeout))
        except OSError as err:
            raise HttpError(f"cannot connect to {address[0]}:{address[1]}: {err}") from None
        try:
            # A request is one small write: sent now, not held back for an ACK (Nagle).
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                if self._proxy is not None:
                    self._tunnel(conn, deadline)
                conn = self._tls.wrap_socket(conn, server_hostname=self._server_name)
        except HttpError:
            conn.close()
            raise
        except (OSError, ValueError) as err:
            conn.close()
            raise HttpError(f"TLS to {self._server_name} failed: {err}") from None
        with self._lock:
            if not self._closed:
                self._busy.add(conn)
                return conn
        conn.close()
        raise HttpError("the client is closed")

    def _tunnel(self, conn: socket.socket, deadline: float) -> None:
        """Ask the proxy for a tunnel to the API server (CONNECT); the TLS goes through it."""
        assert self._proxy is not None
        ask = f"CONNECT {self._authority} HTTP/1.1\r\nHost: {self._authority}\r\n{self._proxy.header}\r\n"
        head = b""
        try:
            conn.settimeout(_left(deadline, self._timeout))
            conn.sendall(ask.encode())
            while b"\r\n\r\n" not in head:
                conn.settimeout(_left(deadline, self._timeout))
                data = conn.recv(4096)
                if not data:
                    raise HttpError("the proxy closed the connection instead of opening a tunnel")
                head += data
                if len(head) > MAX_HEAD:
                    raise HttpError(f"the proxy's answer to CONNECT exceeds {MAX_HEAD} bytes")
        except TimeoutError:
            raise HttpError(f"the proxy did not open a tunnel within {self._timeout:g} s") from None
        status_line = head.partition(b"\r\n")[0]
        fields = status_line.split(b" ", 2)
        if len(fields) < 2 or not fields[0].startswith(b"HTTP/1.") or not fields[1].startswith(b"2"):
            line = status_line[:200].decode(errors="replace")
            raise HttpError(f"the proxy refused a tunnel to {self._authority}: {line}")
        if head.index(b"\r\n\r\n") + 4 != len(head):
            # Bytes after the answer would be read as the TLS handshake's.
            raise HttpError("the proxy sent data before the tunnel opened")

    def _exchange(
        self, conn: socket.socket, request: bytes, deadline: float, reused: bool
    ) -> tuple[int, bytes]:
        """Send the request and read the whole answer; the connection goes back to the pool or is closed."""
        exchange = _Exchange(conn, deadline, self._timeout, MAX_BODY)
        try:
            exchange.send(request)
            while not exchange.answer.done:
                exchange.receive(reused)
        except OSError as err:
            self._done(conn, keep=False)
            if reused and not exchange.received and not isinstance(err, HttpError):
                # Reset or broken pipe on a connection the server had let go of while it waited.
                raise _StaleError(str(err)) from None
            raise
        self._done(conn, keep=exchange.answer.keep_alive)
        return exchange.parser.get_status_code(), exchange.answer.take()


def _cut(conn: socket.socket) -> None:
    """End a connection's traffic both ways: a read blocked on it in another thread returns."""
    # The server may have closed it already.
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


def _closed_by_peer(conn: socket.socket) -> bool:
    """Whether a kept connection has something to read: the server's close (an idle one has nothing else)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _left(deadline: float, timeout: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise HttpError(f"no answer within {timeout:g} s")
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
