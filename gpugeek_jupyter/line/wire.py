"""One TCP connection between a kernel (``Line``) and its cluster's keeper (``Server``).

It opens with a challenge both ways on the cluster's token (HMAC-SHA256 of a fresh nonce each): a
stranger who reaches the port gets no answer to anything, and a kernel knows it reached its own
keeper, not whatever listens there. Both reads before that are of a fixed size and time, so a
stranger can neither hold the keeper nor make it read a message. Then ``Hello`` and ``Welcome``;
then requests, each with an id, answered in any order (a long read of a cell's journal and the
stop button share the connection), with the keeper's ``Said`` lines streamed before a reply.

A kernel's ``Line`` dials again at its next request once the connection is gone (the laptop slept,
the tunnel was reopened); a request without an answer in time closes the connection — through an
SSH tunnel a cut link leaves the local end open and silent — and says so (``LinkDown``), so the
caller can send it again: every request is safe to repeat.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..errors import GpugeekError
from .messages import PROTOCOL, Failed, Hello, ProtocolError, Refused, Said, Welcome, decode, encode, reply_fits

MAGIC = b"GGLINE1\n"             # what a keeper says first: this is the line, and which framing
NONCE = 32
DIGEST = 32
SHAKE_TIMEOUT_S = 10.0          # each read of the challenge, at most
HEADER = struct.Struct("!Q")
MAX_FRAME = 4 << 30             # a message, at most (pushed values ride in one)
KEEPALIVE = (5, 2, 3)           # idle seconds, seconds between probes, probes
REQUEST_THREADS = 64            # requests a keeper works on at once (a kernel's read and stop button, many kernels)


class LinkDown(ConnectionError):
    """The line is down: it could not be dialled, it broke, or a request went unanswered in time."""


class TokenRefused(LinkDown):
    """The keeper closed the line on this kernel's proof of the token: dialling again cannot help."""


class Closed(EOFError):
    """The other end closed the line; ``received``: what had come of the read it ended."""

    def __init__(self, received: int):
        super().__init__("the other end closed the line")
        self.received = received


def _proof(token: bytes, side: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, side + nonce, hashlib.sha256).digest()


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = KEEPALIVE
    for option, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes, or ``Closed`` (an ``EOFError``) when the other end closed first."""
    view = memoryview(bytearray(n))
    got = 0
    while got < n:
        chunk = sock.recv_into(view[got:], n - got)
        if not chunk:
            raise Closed(got)
        got += chunk
    return view.tobytes()


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(HEADER.pack(len(payload)))
    sock.sendall(payload)


def read_frame(sock: socket.socket) -> bytes:
    (size,) = HEADER.unpack(_exactly(sock, HEADER.size))
    if size > MAX_FRAME:
        raise ProtocolError(f"a message of {size} bytes is over the line's {MAX_FRAME} byte limit")
    return _exactly(sock, size)


# -- the kernel's end ---------------------------------------------------------------------------------

class Line:
    """The kernel's end: ``call`` sends a request and returns its reply, dialling first when the
    connection is gone. ``dial()`` gives a connected socket (through the tunnel, opening it anew
    where it died); ``hello`` is what this kernel says of itself."""

    def __init__(self, dial: Callable[[], socket.socket], token: str, hello: Hello):
        self._dial, self._token, self._hello = dial, token.encode(), hello
        self._sock: socket.socket | None = None
        self._send = threading.Lock()
        self._open = threading.Lock()
        self._pending: dict[int, tuple[socket.socket, queue.Queue]] = {}   # by request id, with its connection
        self._ids = itertools.count(1)
        self.welcome: Welcome | None = None
        self.dialled = 0            # connections made (the first, then each after the line came back)

    @property
    def up(self) -> bool:
        return self._sock is not None

    def open(self) -> Welcome:
        """Connect, prove both ends and exchange versions, unless connected already."""
        with self._open:
            if self._sock is not None:
                return self.welcome
            try:
                sock = self._dial()
            except OSError as exc:
                raise LinkDown(f"the keeper does not answer ({exc})") from None
            try:
                self.welcome = self._shake(sock)
            except BaseException:
                sock.close()
                raise
            self._sock = sock
            self.dialled += 1
            threading.Thread(target=self._read, args=(sock,), name="gpugeek-line", daemon=True).start()
            return self.welcome

    def _shake(self, sock: socket.socket) -> Welcome:
        sock.settimeout(SHAKE_TIMEOUT_S)
        try:
            opening = _exactly(sock, len(MAGIC) + NONCE)
        except Closed as exc:     # an SSH tunnel accepts here and closes when nothing listens behind it
            raise LinkDown("the keeper closed the line during its opening" if exc.received else
                           "nothing answered behind the line: it closed before a word (no keeper listens on "
                           "the head)") from None
        except OSError as exc:
            raise LinkDown(f"no opening from the keeper within {SHAKE_TIMEOUT_S:.0f} s" if isinstance(exc, TimeoutError)
                           else f"the line broke before the keeper's opening ({type(exc).__name__})") from None
        if not opening.startswith(MAGIC):
            raise GpugeekError("what answers at the cluster's address is not this cluster — `%gpugeek down` it and "
                               "`up` it again")
        mine = os.urandom(NONCE)
        try:
            sock.sendall(_proof(self._token, b"kernel", opening[len(MAGIC):]) + mine)
            theirs = _exactly(sock, DIGEST)
        except (EOFError, ConnectionResetError):     # the keeper read the proof and closed: not its token
            raise TokenRefused("the keeper closed the line on this kernel's proof of the token: this kernel's "
                               "token is not the cluster's") from None
        except OSError as exc:
            raise LinkDown(f"the keeper did not answer this kernel's proof of the token "
                           f"({type(exc).__name__})") from None
        if not hmac.compare_digest(theirs, _proof(self._token, b"keeper", mine)):
            raise GpugeekError("what answers at the cluster's address does not hold the cluster's token, so it is not "
                               "this cluster — `%gpugeek down` it and `up` it again")
        try:
            send_frame(sock, encode(0, self._hello))
            _, answer = decode(read_frame(sock))
        except (OSError, EOFError) as exc:
            raise LinkDown(f"the keeper closed the line after its opening ({type(exc).__name__})") from None
        sock.settimeout(None)
        _keepalive(sock)
        if isinstance(answer, Refused):
            raise GpugeekError(answer.why)
        if not isinstance(answer, Welcome):
            raise GpugeekError("the cluster did not let this kernel in — run the kernel with the gpugeek-jupyter "
                               "version that started the cluster")
        return answer

    def call(self, request, timeout: float, said: Callable[[str], None] | None = None,
             meanwhile: Callable[[], None] | None = None):
        """``request``'s reply (``Done``, or its own type), waiting at most ``timeout`` seconds;
        ``meanwhile()`` runs once it is on its way (work that need not wait for the reply); the
        keeper's ``Said`` lines go to ``said``, in this thread. ``Failed`` raises
        ``GpugeekError`` with its line; no answer in time, or a line that broke, ``LinkDown``."""
        self.open()
        number = next(self._ids)
        answers: queue.Queue = queue.Queue()
        sock = self._sock
        if sock is None:
            raise LinkDown("the line broke")
        self._pending[number] = (sock, answers)
        try:
            try:
                payload = encode(number, request)
                with self._send:
                    send_frame(sock, payload)
            except OSError as exc:
                self.close()
                raise LinkDown(f"the line broke ({type(exc).__name__})") from None
            deadline = time.monotonic() + timeout
            if meanwhile is not None:
                meanwhile()
            while True:
                try:
                    answer = answers.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    self.close()
                    raise LinkDown(f"no answer from the keeper within {timeout:.0f} s") from None
                if isinstance(answer, LinkDown):
                    raise answer
                if isinstance(answer, Said):
                    if said is not None:
                        said(answer.text)
                    continue
                if isinstance(answer, Failed):
                    raise GpugeekError(answer.why)
                if not reply_fits(request, answer):
                    raise GpugeekError("the cluster answered in a way this kernel does not know — run the kernel with "
                                       "the gpugeek-jupyter "
                                       "version that started the cluster")
                return answer
        finally:
            self._pending.pop(number, None)

    def close(self) -> None:
        """Drop the connection (the next call dials again); calls waiting on it get ``LinkDown``."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _read(self, sock: socket.socket) -> None:
        """This connection's replies, each to the call that waits for it, until it breaks."""
        why = "the line broke"
        try:
            while True:
                number, answer = decode(read_frame(sock))
                waiting = self._pending.get(number)
                if waiting is not None:
                    waiting[1].put(answer)
        except (OSError, EOFError, ProtocolError) as exc:
            why = f"the line broke ({exc})" if isinstance(exc, ProtocolError) else why
        if self._sock is sock:
            self.close()
        for on, waiting in list(self._pending.values()):
            if on is sock:
                waiting.put(LinkDown(why))


# -- the keeper's end ---------------------------------------------------------------------------------

class Caller:
    """Who a request came from, as the keeper's handler sees it: the kernel's ``Hello``, and
    ``say(text)`` to stream a line into the cell that waits for the reply."""

    def __init__(self, hello: Hello, say: Callable[[str], None]):
        self.hello, self.say = hello, say


class Server:
    """The keeper's end: listens at ``address``; each connection proves the token, then each of its
    requests runs ``handle(request, caller)`` in a thread of its own. ``welcome(hello)`` answers
    the kernel's hello: a ``Welcome``, or a ``Refused`` that says why."""

    def __init__(self, address: tuple[str, int], token: str, welcome: Callable[[Hello], object],
                 handle: Callable[[object, Caller], object], log: Callable[[str], None] = print):
        self._token = token.encode()
        self.welcome, self.handle, self.log = welcome, handle, log
        self._listener = socket.create_server(address)
        self.address = self._listener.getsockname()[:2]
        # requests run on a pool: a thread started per request costs a cell more than its bytes
        self._pool = ThreadPoolExecutor(max_workers=REQUEST_THREADS, thread_name_prefix="gpugeek-request")

    def serve_forever(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except OSError:
                return      # closed
            threading.Thread(target=self._connection, args=(sock, peer), name="gpugeek-line-in",
                             daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _connection(self, sock: socket.socket, peer) -> None:
        with sock:
            hello = self._shake(sock, peer)
            if hello is None:
                return
            lock = threading.Lock()

            def send(number: int, msg) -> None:
                payload = encode(number, msg)
                with lock:
                    send_frame(sock, payload)

            while True:
                try:
                    number, request = decode(read_frame(sock))
                except (OSError, EOFError, ProtocolError) as exc:
                    if isinstance(exc, ProtocolError):
                        self.log(f"line: {peer}: {exc}; closing it")
                    return
                self._pool.submit(self._request, number, request, hello, send)

    def _shake(self, sock: socket.socket, peer) -> Hello | None:
        """The token proved both ways and the versions told; None when the peer fails either."""
        sock.settimeout(SHAKE_TIMEOUT_S)
        try:
            mine = os.urandom(NONCE)
            sock.sendall(MAGIC + mine)
            answer = _exactly(sock, DIGEST + NONCE)
            if not hmac.compare_digest(answer[:DIGEST], _proof(self._token, b"kernel", mine)):
                self.log(f"line: {peer} does not hold the cluster's token; closed without an answer")
                return None
            sock.sendall(_proof(self._token, b"keeper", answer[DIGEST:]))
            number, hello = decode(read_frame(sock))
            if not isinstance(hello, Hello):
                send_frame(sock, encode(number, Refused(why="this is not a kernel of this cluster's gpugeek-jupyter — "
                                                            "connect with the version that started it")))
                return None
            told = self.welcome(hello)
            send_frame(sock, encode(number, told))
            if isinstance(told, Refused):
                self.log(f"line: {hello.kernel} refused: {told.why}")
                return None
        except (OSError, EOFError, ProtocolError) as exc:
            self.log(f"line: {peer} left during the opening ({type(exc).__name__})")
            return None
        sock.settimeout(None)
        _keepalive(sock)
        return hello

    def _request(self, number: int, request, hello: Hello, send) -> None:
        def say(text: str) -> None:
            try:
                send(number, Said(text=text))
            except OSError:
                pass

        try:
            reply = self.handle(request, Caller(hello, say))
        except GpugeekError as exc:
            reply = Failed(why=str(exc))
        except Exception as exc:  # noqa: BLE001 - the keeper's own failure: said in one line, logged whole
            import traceback

            self.log(f"line: {type(request).__name__} from {hello.kernel} failed:\n{traceback.format_exc()}")
            reply = Failed(why=f"the cluster's keeper failed ({type(exc).__name__}: {exc}) — run the cell again; if it "
                               f"fails again, send the head's keeper log with a bug report", ours=True)
        if not isinstance(reply, Failed) and not reply_fits(request, reply):     # ours: said, and logged
            self.log(f"line: {type(request).__name__} answered {type(reply).__name__}, which it does not declare")
            reply = Failed(why="the cluster's keeper answered wrongly — send the head's keeper log with a bug report",
                           ours=True)
        try:
            send(number, reply)
        except OSError:
            pass      # the kernel is gone, or its line broke: it asks again


def refusal(hello: Hello, package: str, python: str) -> Refused | None:
    """The one line that refuses a kernel that speaks another protocol, naming both ends' versions;
    None when it speaks this one."""
    if hello.protocol == PROTOCOL:
        return None
    return Refused(why=f"the cluster runs gpugeek-jupyter {package} (Python {python}) and this kernel "
                   f"gpugeek-jupyter {hello.package}, which cannot talk (link version {PROTOCOL} there, "
                   f"{hello.protocol} here) — run the kernel with gpugeek-jupyter {package}, or `%gpugeek down` the "
                   "cluster and `up` it from "
                   f"this kernel")
