"""The web server's connection handling: gunicorn's threaded worker, with every read bounded.

gunicorn's `gthread` worker hands a connection to a thread as soon as it has sent a byte, and
the thread then blocks until the request line and headers are complete, and later until the
body is; neither has a time limit. Ten clients that send half a header and go silent hold ten
threads for good, and every other request waits behind them.

`BoundedThreadWorker` changes two things:

1. Request heads are read on the worker's event loop, never in a thread. A connection joins
   the thread pool only once its request line and headers are complete; a client that does not
   finish them within `header_timeout` seconds is answered 408 and closed. Idle or slow heads
   cost a socket and at most `MAX_HEAD_BYTES` of buffer, not a thread.
2. In a thread, the socket (`BoundedSocket`) bounds the body: a read waits at most
   `read_timeout` seconds, and once that much time has passed the body must have arrived at
   `min_body_rate` bytes a second on average; a write may stall for `read_timeout` seconds at
   most. A stalled or trickling upload therefore gives its thread back within a bounded time,
   by a TimeoutError that `boardwalk.http.middleware` answers with 408.

3. An answer says `Connection: keep-alive` only when the connection is kept. gunicorn reuses a
   connection after draining the body the application left unread, at most 64 KiB within
   5 s; past that it closes the connection it had announced as kept, and the client's next
   request on it fails. Before the head of an answer is written, the rest of the request body
   is read here within those bounds; a body larger, slower, chunked or broken makes the answer
   say `Connection: close` instead (`_answer_after_body`).

Connections per process are capped by gunicorn's `worker_connections`.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import time
from collections import deque
from functools import partial
from typing import Any

from django.conf import settings
from gunicorn.http.body import LengthReader
from gunicorn.http.wsgi import Response
from gunicorn.workers.gthread import TConn, ThreadWorker

# A request head (request line + headers) larger than this goes to gunicorn's parser, whose
# own limits (limit_request_line, limit_request_fields, limit_request_field_size) refuse it.
MAX_HEAD_BYTES = 64 * 1024
_HEAD_END = (b"\r\n\r\n", b"\n\n")
_TIMEOUT_BODY = (
    b'{"error":{"type":"invalid_request_error","code":"request_timeout",'
    b'"message":"The request headers did not arrive in time.","param":null}}'
)
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json\r\n"
    b"x-should-retry: true\r\nContent-Length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


# What gunicorn drains of an unread body, and for how long, before reusing a connection
# (gunicorn.http.parser's cap and gthread's data timeout): a body left past these closes it.
DRAIN_MAX_BYTES = 64 * 1024
DRAIN_SECONDS = 5.0
_DRAIN_CHUNK = 8192


class BodyTooSlow(TimeoutError):
    """The client sent the request body slower than the server accepts."""


class BoundedSocket(socket.socket):
    """A client socket whose blocking reads and writes are bounded in time.

    gunicorn switches a connection between blocking mode (in a thread) and non-blocking mode
    (in its event loop) with `setblocking`; here "blocking" means "with a timeout".
    """

    read_timeout: float = 30.0
    min_body_rate: float = 4096.0
    _started = 0.0
    _received = 0

    @classmethod
    def adopt(cls, sock: socket.socket, *, read_timeout: float, min_body_rate: float) -> Any:
        bounded = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        bounded.read_timeout = read_timeout
        bounded.min_body_rate = min_body_rate
        return bounded

    def setblocking(self, flag: bool) -> None:
        if flag:
            self.settimeout(self.read_timeout)
        else:
            super().setblocking(False)

    def begin_request(self) -> None:
        self._started = time.monotonic()
        self._received = 0

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if self.gettimeout() is not None and self._started:
            elapsed = time.monotonic() - self._started
            if elapsed > self.read_timeout and self._received < self.min_body_rate * elapsed:
                raise BodyTooSlow(
                    f"request body slower than {self.min_body_rate:.0f} bytes/s on average"
                )
        data = super().recv(bufsize, flags)
        self._received += len(data)
        return data

    def sendall(self, data: Any, flags: int = 0) -> None:
        # socket.sendall's timeout bounds the whole call; a large response to a slow but
        # steady reader must not fail, so the timeout applies to each send's progress.
        if self.gettimeout() is None or self.gettimeout() == 0.0:
            super().sendall(data, flags)
            return
        view = memoryview(data).cast("B")
        while view:
            sent = self.send(view, flags)
            view = view[sent:]


class BoundedThreadWorker(ThreadWorker):
    """gunicorn's gthread worker with request heads read on the event loop (see module doc)."""

    header_timeout = 10.0
    read_timeout = 30.0
    min_body_rate = 4096.0
    wsgi: Any  # the application, set by load_wsgi

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = settings.HTTP_HEADER_TIMEOUT
        self.read_timeout = settings.HTTP_READ_TIMEOUT
        self.min_body_rate = settings.HTTP_MIN_BODY_RATE
        self.reading_heads: deque[TConn] = deque()

    # -- new and kept-alive connections wait for a complete head on the event loop ---------

    def accept(self, listener: socket.socket) -> None:
        try:
            client_sock, client_addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        sock = BoundedSocket.adopt(
            client_sock, read_timeout=self.read_timeout, min_body_rate=self.min_body_rate
        )
        conn = TConn(self.cfg, sock, client_addr, listener.getsockname())
        self._read_head(conn)

    def on_client_socket_readable(self, conn: TConn, client: Any) -> None:
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._read_head(conn)

    def _read_head(self, conn: TConn) -> None:
        conn.sock.setblocking(False)
        conn.head = bytearray()
        conn.head_deadline = time.monotonic() + self.header_timeout
        self.reading_heads.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_head_data, conn))

    def _on_head_data(self, conn: TConn, client: Any) -> None:
        try:
            data = conn.sock.recv(MAX_HEAD_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away
            self._drop_head(conn)
            self.nr_conns -= 1
            conn.close()
            return
        head = conn.head
        seen = len(head)
        head += data
        if len(head) < MAX_HEAD_BYTES and not any(
            head.find(end, max(0, seen - len(end) + 1)) >= 0 for end in _HEAD_END
        ):
            return
        self._drop_head(conn)
        conn.prefetched = bytes(head)
        conn.data_ready = True
        self.enqueue_req(conn)

    def _drop_head(self, conn: TConn) -> None:
        self.reading_heads.remove(conn)
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.poller.unregister(conn.sock)
        conn.head = bytearray()

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        # Deadlines are set at a constant distance from now, so the deque is in order.
        while self.reading_heads and self.reading_heads[0].head_deadline <= now:
            conn = self.reading_heads[0]
            self._drop_head(conn)
            self.nr_conns -= 1
            with contextlib.suppress(OSError):  # best effort: the socket is non-blocking
                conn.sock.send(_TIMEOUT_RESPONSE)
            conn.close()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.wsgi = partial(_answer_after_body, self.wsgi)

    # -- in a thread: the head is parsed from what the event loop read ----------------------

    def handle(self, conn: TConn) -> Any:
        prefetched = getattr(conn, "prefetched", None)
        if prefetched:
            conn.prefetched = None
            try:
                conn.sock.setblocking(True)
                conn.init()
            except OSError:
                return False
            conn.parser.unreader.unread(prefetched)
        begin = getattr(conn.sock, "begin_request", None)  # absent once wrapped in TLS
        if begin is not None:
            begin()
        return super().handle(conn)


def _answer_after_body(app: Any, environ: dict[str, Any], start_response: Any) -> Any:
    """The application, with the rest of the request body read before an answer's head is
    written (see the module doc, 3.): an early answer (401, 413, 503 before the body was
    read) keeps its connection only where the body could be drained, else says close."""

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        write = start_response(status, headers, exc_info)
        # gunicorn writes the head with the first piece of the body, after this returns.
        response = getattr(start_response, "__self__", None)
        if (
            isinstance(response, Response)
            and not response.headers_sent
            and not response.should_close()
            and not _body_drained(environ)
        ):
            response.force_close()
        return write

    return app(environ, start)


def _body_drained(environ: dict[str, Any]) -> bool:
    """Read and drop what the application left of the request body, within gunicorn's drain
    bounds; False when it could not be (too large, too slow, chunked, the client gone)."""
    body = environ["wsgi.input"]
    reader = getattr(body, "reader", None)
    if not isinstance(reader, LengthReader):  # chunked: its end is not known
        return False
    if reader.length == 0 and not body.buf.tell():
        return True
    if reader.length >= DRAIN_MAX_BYTES:
        return False
    sock = environ.get("gunicorn.socket")
    prior = sock.gettimeout() if sock is not None else None
    deadline = time.monotonic() + DRAIN_SECONDS
    try:
        while True:
            if sock is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                sock.settimeout(min(remaining, prior) if prior else remaining)
            if not body.read(_DRAIN_CHUNK):
                return True
    except Exception:
        # Whatever stopped the read (a timeout, the client gone, a malformed body), where
        # the next request would start is unknown: the connection closes.
        return False
    finally:
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.settimeout(prior)
