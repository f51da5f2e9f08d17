"""The cell line: rank 0 hands each cell to the other ranks over a socket of its own.

A cell and its answer cross from rank 0 to another host and back in about 0.2 ms this way,
against about 1.2 ms by Ray actor call (``benchmarks/bench_remote.py``, part C, in the lab).
Rank 0 listens on its node's address — the direction the ``torch.distributed`` rendezvous
already takes, so a firewall that lets the group form lets this through — and every other rank
connects once, when the group is built. Both ends prove they hold a key that travelled through
Ray (the HMAC challenge of ``multiprocessing.connection``), then the listening socket is closed.
A rank whose line cannot be made gets its cells by actor call.

A process that dies closes its end at once; TCP keepalive notices a host gone silent within
about 11 s. A line that broke while the group was idle (a host cut off for a few seconds) is
dropped before the next cell, whose rank is then reached by actor call: Ray's health checks ride
out a cut the keepalive does not. A line that died unseen on rank 0's end breaks as the next cell
is sent; a rank says each cell has arrived before it runs it, so one whose line broke before is
known not to have it, and gets it by actor call too. Interrupts and drains still go by actor call: the line's thread
is busy with the cell.
"""

from __future__ import annotations

import os
import pickle
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from typing import NamedTuple

ACCEPT_TIMEOUT_S = 10.0
UNREACHED = "unreached"     # a line that broke before the cell reached the rank
HANDSHAKE_TIMEOUT_S = 5.0
KEEPALIVE = (5, 2, 3)       # idle seconds, seconds between probes, probes


def flat(record: tuple) -> tuple:
    """A record (a ``NamedTuple``) as it crosses a line: its fields, and no class named (a pickled
    class is looked up by name on the other end: BENCHMARKS.md, ``bench_records.py``); the reader
    knows which record comes and rebuilds it (``CellSent(*raw)``)."""
    return tuple(record)


class CellSent(NamedTuple):
    """A cell from rank 0 to another rank: the pickled ``CellCall`` and the pushed variables."""

    cell_id: int
    call: bytes
    pushed: bytes | None = None


class CellAnswer(NamedTuple):
    """A rank's word on a cell: first that it arrived (``result`` None), then its result."""

    cell_id: int
    result: dict | None = None


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = KEEPALIVE
    for option, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, option):      # Linux; elsewhere the system's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _receive_timeout(sock: socket.socket, seconds: float) -> None:
    """A limit on each blocking read of the socket (0: none) that holds once the socket is a
    ``Connection``, which reads its file descriptor directly: a stranger who connects and says
    nothing cannot hold the handshake."""
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                    struct.pack("ll", whole, int((seconds - whole) * 1e6)))


def shake(sock: socket.socket, key: bytes, first: bool, rank: int | None = None) -> tuple[Connection, int]:
    """Both ends prove the key, and the other rank says which it is; the socket is closed after
    (the connection holds a duplicate of it)."""
    conn = None
    try:
        _keepalive(sock)
        sock.settimeout(None)
        _receive_timeout(sock, HANDSHAKE_TIMEOUT_S)
        conn = Connection(os.dup(sock.fileno()))
        if first:
            deliver_challenge(conn, key)
            answer_challenge(conn, key)
            rank = pickle.loads(conn.recv_bytes(64))
        else:
            answer_challenge(conn, key)
            deliver_challenge(conn, key)
            conn.send_bytes(pickle.dumps(rank))
        _receive_timeout(sock, 0)
        return conn, rank
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    finally:
        sock.close()


class Switchboard:
    """Rank 0's end: listens until every other rank has connected, then holds one line each."""

    def __init__(self, ip: str):
        self.key = secrets.token_bytes(32)
        self._server: socket.socket | None = socket.create_server((ip, 0))
        self.address = (ip, self._server.getsockname()[1])
        self.lines: dict[int, Connection] = {}
        self._reached: dict[int, int] = {}     # rank → the latest cell it said had arrived

    def accept(self, ranks: set[int], timeout: float = ACCEPT_TIMEOUT_S) -> set[int]:
        """Take the ranks' connections (strangers are turned away); close the listening socket.
        Returns the ranks that did not connect in time."""
        deadline = time.monotonic() + timeout
        server, self._server = self._server, None
        try:
            while ranks - set(self.lines) and (left := deadline - time.monotonic()) > 0:
                server.settimeout(left)
                try:
                    sock, _ = server.accept()
                except (TimeoutError, OSError):
                    break
                try:
                    conn, rank = shake(sock, self.key, first=True)
                except Exception:  # noqa: BLE001 - not one of ours (or gave up): turned away
                    continue
                if rank in ranks and rank not in self.lines:
                    self.lines[rank] = conn
                else:
                    conn.close()
        finally:
            server.close()
        return ranks - set(self.lines)

    def sweep(self) -> set[int]:
        """Between two cells: drop the lines that broke while the group was idle — a host cut off
        for a few seconds outlasts the line's keepalive, not Ray's health checks, so its rank
        still lives and is reached by actor call. A late answer to an interrupted cell is read
        and dropped. Returns the ranks whose line was dropped."""
        broken = set()
        while ready := wait(list(self.lines.values()), 0):
            for conn in ready:
                rank = next(r for r, c in self.lines.items() if c is conn)
                try:
                    conn.recv_bytes()
                except (EOFError, OSError):
                    conn.close()
                    del self.lines[rank]
                    broken.add(rank)
        return broken

    def send(self, rank: int, cell_id: int, call: bytes, pushed: bytes | None) -> bool:
        """Hand a cell to ``rank``; False if it has no line or its line is broken (the line is
        dropped: the rank is reached by actor call from then on)."""
        if rank not in self.lines:
            return False
        try:
            self.lines[rank].send_bytes(pickle.dumps(flat(CellSent(cell_id, call, pushed)),
                                                     protocol=pickle.HIGHEST_PROTOCOL))
            return True
        except OSError:
            self.lines.pop(rank).close()
            return False

    def receive(self, ranks: set[int], cell_id: int, timeout: float | None) -> list[tuple[int, dict | str | None]]:
        """The answers of ``ranks`` that came within ``timeout``: (rank, result); (rank, None) for
        a rank whose line broke once the cell had reached it (its process died, its host went
        silent); (rank, ``UNREACHED``) for one whose line broke before — a line that had died
        unseen (a cut past the keepalive, on the other end only): the rank may well live. A
        broken line is dropped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        by_conn = {self.lines[rank]: rank for rank in ranks}
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            out = []
            for conn in wait(list(by_conn), left):
                rank = by_conn.pop(conn)
                try:
                    answer = CellAnswer(*pickle.loads(conn.recv_bytes()))
                except (EOFError, OSError):
                    out.append((rank, None if self._reached.get(rank) == cell_id else UNREACHED))
                    self.lines.pop(rank).close()
                    continue
                by_conn[conn] = rank
                if answer.cell_id != cell_id:         # an earlier cell's late answer is dropped
                    continue
                if answer.result is None:             # it arrived: its result comes next
                    self._reached[rank] = cell_id
                else:
                    del by_conn[conn]
                    out.append((rank, answer.result))
            if out or left == 0 or not by_conn:
                return out

    def close(self) -> None:
        for conn in self.lines.values():
            conn.close()
        self.lines.clear()


def serve(address: tuple[str, int], key: bytes, rank: int, execute: Callable[[bytes, bytes | None], dict]) -> None:
    """Another rank's end: connect to rank 0 in a thread of its own and run each cell that comes."""

    def loop() -> None:
        try:
            conn, _ = shake(socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S), key,
                             first=False, rank=rank)
        except Exception:  # noqa: BLE001 - no line: rank 0 reaches this rank by actor call
            return
        while True:
            try:
                sent = CellSent(*pickle.loads(conn.recv_bytes()))
                conn.send_bytes(pickle.dumps(flat(CellAnswer(sent.cell_id))))
            except (EOFError, OSError):      # rank 0 is gone, or the group is stopped
                return
            result = execute(sent.call, sent.pushed)
            try:
                conn.send_bytes(pickle.dumps(flat(CellAnswer(sent.cell_id, result)), protocol=pickle.HIGHEST_PROTOCOL))
            except OSError:
                return

    threading.Thread(target=loop, name="gpugeek-cell-line", daemon=True).start()
