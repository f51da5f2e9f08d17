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
from typing import NamedTuple

from .line import HANDSHAKE_TIMEOUT_S, flat, shake

KEEPER = -1      # who connects, in the handshake's rank field


# -- what crosses the lead line: one record a request, one an answer ----------------------------

class LeadCell(NamedTuple):
    """Lead a cell on every rank (``Worker.execute_all``): the pickled ``CellCall`` and what was
    pushed (bytes, as the keeper got them)."""

    call: bytes
    pushed: list | None = None


class DrainCell(NamedTuple):
    """Rank 0's drain into the cell's journal, and the journal from ``cursor`` (``Worker.drain_all``)."""

    wait_s: float
    cursor: int
    number: int


REQUESTS = {kind.__name__: kind for kind in (LeadCell, DrainCell)}


class Asked(NamedTuple):
    number: int                    # the keeper's id of the request, answered in any order
    request: LeadCell | DrainCell

    def wire(self) -> tuple:
        """(number, the request's kind, its fields): records cross the line flat (``line.flat``)."""
        return self.number, type(self.request).__name__, flat(self.request)

    @classmethod
    def read(cls, raw: tuple) -> Asked:
        number, kind, values = raw
        return cls(number, REQUESTS[kind](*values))


class Answered(NamedTuple):
    number: int
    ok: bool
    value: object                  # the handler's value, or the error said in one line


class LeadDoor:
    """Rank 0's end: listens for the keeper, answers each request with the handler of its type."""

    def __init__(self, ip: str, handlers: dict[type, Callable]):
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

        def answer(asked: Asked) -> None:
            try:
                reply = Answered(asked.number, True, self.handlers[type(asked.request)](asked.request))
            except Exception as exc:  # noqa: BLE001 - the keeper says it as the rank's failure
                reply = Answered(asked.number, False, f"{type(exc).__name__}: {exc}")
            try:
                data = pickle.dumps(flat(reply), protocol=pickle.HIGHEST_PROTOCOL)
                with lock:
                    conn.send_bytes(data)
            except OSError:
                pass      # the keeper is gone: it asks again on its next connection

        while True:
            try:
                asked = Asked.read(pickle.loads(conn.recv_bytes()))
            except Exception:  # noqa: BLE001 - gone, or cut under the read by close()
                self._open.discard(conn)
                conn.close()          # closed by its reader alone: a second close could hit a reused fd
                return
            threading.Thread(target=answer, args=(asked,), name=f"gpugeek-lead-{type(asked.request).__name__}",
                             daemon=True).start()

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
    """The keeper's end: ``ask(request)`` is a ``Future`` of rank 0's answer; ``ConnectionError``
    once the line broke (rank 0 died, or its host went silent: TCP keepalive tells within ~11 s)."""

    def __init__(self, address: tuple[str, int], key: bytes):
        self.conn, _ = shake(socket.create_connection(tuple(address), timeout=HANDSHAKE_TIMEOUT_S), key,
                             first=False, rank=KEEPER)
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.broken: str | None = None
        threading.Thread(target=self._read, name="gpugeek-lead-line", daemon=True).start()

    def ask(self, request: LeadCell | DrainCell) -> Future:
        future: Future = Future()
        number = next(self._ids)
        self._pending[number] = future
        try:
            data = pickle.dumps(Asked(number, request).wire(), protocol=pickle.HIGHEST_PROTOCOL)
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
                answered = Answered(*pickle.loads(self.conn.recv_bytes()))
            except Exception as exc:  # noqa: BLE001 - EOF, a reset, or the handle closed under the read
                self.broken = f"{type(exc).__name__}"
                for future in list(self._pending.values()):
                    if not future.done():
                        future.set_exception(ConnectionError("rank 0's lead line broke: rank 0 is gone"))
                self._pending.clear()
                with self._lock:
                    self.conn.close()      # by its reader alone, once no send can be under way
                return
            future = self._pending.pop(answered.number, None)
            if future is not None and not future.done():
                if answered.ok:
                    future.set_result(answered.value)
                else:
                    future.set_exception(RuntimeError(answered.value))

    def close(self) -> None:
        _shut(self.conn)
