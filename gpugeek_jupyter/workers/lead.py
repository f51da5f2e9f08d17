"""The lead line: a keeper's own connection to rank 0 of a group it holds, for what a cell asks of
rank 0 — lead it on every rank (``execute_all``), read its journal (``drain_all``) — in place of
Ray actor calls, each of which costs the keeper about a millisecond more than a message on a
socket of its own (``benchmarks/bench_line.py``), as the cell line does between the ranks.

Rank 0 listens on its node's address; the keeper connects, and both ends prove the key that
travelled through Ray (the cell line's handshake). A keeper that started again connects again:
the newer connection replaces the older. Requests carry an id and are answered on their
connection in any order (a journal read held for news, and a cell's lead, share it); each runs in
a thread of its own on rank 0, as actor calls on its threads did. A connection that breaks fails
what waits on it: the keeper then takes rank 0 for dead, as a failed actor call said.
"""

from __future__ import annotations

import itertools
import os
import pickle
import secrets
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future

from .line import HANDSHAKE_TIMEOUT_S, shake

KEEPER = -1      # who connects, in the handshake's rank field


class LeadDoor:
    """Rank 0's end: listens for the keeper, answers each request with ``handlers[op](*args)``."""

    def __init__(self, ip: str, handlers: dict[str, Callable]):
        self.key = secrets.token_bytes(32)
        self.handlers = handlers
        self._server = socket.create_server((ip, 0))
        self._open: set = set()           # the keepers' connections, cut when the door closes
        self.address = (ip, self._server.getsockname()[1])
        threading.Thread(target=self._accept, name="gpugeek-lead-door", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return       # closed
            try:
                conn, who = shake(sock, self.key, first=True)
            except Exception:  # noqa: BLE001 - not the keeper (or it gave up): turned away
                continue
            if who != KEEPER:
                conn.close()
                continue
            self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="gpugeek-lead", daemon=True).start()

    def _serve(self, conn) -> None:
        lock = threading.Lock()

        def answer(number: int, op: str, args: tuple) -> None:
            try:
                reply = (number, True, self.handlers[op](*args))
            except Exception as exc:  # noqa: BLE001 - the keeper says it as the rank's failure
                reply = (number, False, f"{type(exc).__name__}: {exc}")
            try:
                data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
                with lock:
                    conn.send_bytes(data)
            except OSError:
                pass      # the keeper is gone: it asks again on its next connection

        while True:
            try:
                number, op, args = pickle.loads(conn.recv_bytes())
            except Exception:  # noqa: BLE001 - gone, or cut under the read by close()
                self._open.discard(conn)
                conn.close()          # closed by its reader alone: a second close could hit a reused fd
                return
            threading.Thread(target=answer, args=(number, op, args), name=f"gpugeek-lead-{op}", daemon=True).start()

    def close(self) -> None:
        """Stop answering, as rank 0's process going does: the keeper's end sees its line break."""
        self._server.close()
        for conn in list(self._open):
            _shut(conn)


def _shut(conn) -> None:
    """Shut a connection down, both ways: the thread reading it wakes to EOF and closes it (a close
    from here would leave that thread blocked, or reading a handle already gone)."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, TypeError, ValueError):
        pass     # already closed


class LeadLine:
    """The keeper's end: ``ask(op, *args)`` is a ``Future`` of rank 0's answer; ``ConnectionError``
    once the line broke (rank 0 died, or its host went silent: TCP keepalive tells within ~11 s)."""

    def __init__(self, address: tuple[str, int], key: bytes):
        self.conn, _ = shake(socket.create_connection(tuple(address), timeout=HANDSHAKE_TIMEOUT_S), key,
                             first=False, rank=KEEPER)
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.broken: str | None = None
        threading.Thread(target=self._read, name="gpugeek-lead-line", daemon=True).start()

    def ask(self, op: str, *args) -> Future:
        future: Future = Future()
        number = next(self._ids)
        self._pending[number] = future
        try:
            data = pickle.dumps((number, op, args), protocol=pickle.HIGHEST_PROTOCOL)
            with self._lock:
                if self.broken:
                    raise OSError(self.broken)
                self.conn.send_bytes(data)
        except OSError as exc:
            self._pending.pop(number, None)
            future.set_exception(ConnectionError(f"rank 0's lead line broke ({exc})"))
        return future

    def _read(self) -> None:
        while True:
            try:
                number, ok, value = pickle.loads(self.conn.recv_bytes())
            except Exception as exc:  # noqa: BLE001 - EOF, a reset, or the handle closed under the read
                self.broken = f"{type(exc).__name__}"
                for future in list(self._pending.values()):
                    if not future.done():
                        future.set_exception(ConnectionError("rank 0's lead line broke: rank 0 is gone"))
                self._pending.clear()
                with self._lock:
                    self.conn.close()      # by its reader alone, once no send can be under way
                return
            future = self._pending.pop(number, None)
            if future is not None and not future.done():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(RuntimeError(value))

    def close(self) -> None:
        _shut(self.conn)
