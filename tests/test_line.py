"""The cell line between rank 0 and the other ranks, on loopback (no Ray): cells and answers go
through, a stranger without the key is turned away, and a rank whose process goes is seen gone."""

from __future__ import annotations

import pickle
import socket
import subprocess
import sys
import textwrap
import time
from multiprocessing.connection import wait

import pytest

from gpugeek_jupyter.workers import line


def echo(call: bytes, pushed: bytes | None) -> dict:
    return {"ok": True, "output": pickle.loads(call) + (pushed or b"").decode(), "samples": []}


def test_cells_reach_each_rank_and_strangers_are_turned_away():
    board = line.Switchboard("127.0.0.1")
    with socket.create_connection(board.address) as stranger:     # connects first, knows no key
        stranger.sendall(b"\x00\x00\x00\x05hello")
        for rank in (1, 2):
            line.serve(board.address, board.key, rank, echo)
        missing = board.accept({1, 2}, timeout=10)
    assert missing == set() and sorted(board.lines) == [1, 2]
    with pytest.raises(ConnectionRefusedError):     # no longer listening
        socket.create_connection(board.address, timeout=1).close()
    try:
        for cell_id in (1, 2):
            for rank in (1, 2):
                assert board.send(rank, cell_id, pickle.dumps(f"cell {cell_id} "), b"pushed")
            got = {}
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                got.update(board.receive(set(board.lines) - set(got), cell_id, timeout=1))
            assert got == {1: {"ok": True, "output": f"cell {cell_id} pushed", "samples": []},
                           2: {"ok": True, "output": f"cell {cell_id} pushed", "samples": []}}
    finally:
        board.close()


def test_a_rank_whose_process_ends_is_seen_gone_at_once():
    board = line.Switchboard("127.0.0.1")
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, pickle, time
        from gpugeek_jupyter.workers import line
        line.serve({board.address!r}, {board.key!r}, 1, lambda call, pushed: os._exit(3))
        time.sleep(30)
        """)])
    try:
        assert board.accept({1}, timeout=20) == set()
        assert board.send(1, 1, pickle.dumps("pass"), None)
        start = time.monotonic()
        assert board.receive({1}, 1, timeout=10) == [(1, None)]
        assert time.monotonic() - start < 5
        assert child.wait(timeout=10) == 3
    finally:
        child.kill()
        child.wait()
        board.close()



def test_a_line_broken_while_the_group_was_idle_is_dropped_before_the_next_cell():
    """A host cut off between two cells for longer than the line's keepalive leaves a broken line
    to a rank that still lives (Ray rides such a cut out): the next cell sweeps it — reaching that
    rank by actor call — instead of taking the rank for dead. A late answer to an earlier cell
    left on a good line is read and dropped, the line kept."""
    board = line.Switchboard("127.0.0.1")
    line.serve(board.address, board.key, 1, echo)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, time
        from gpugeek_jupyter.workers import line
        line.serve({board.address!r}, {board.key!r}, 2, lambda call, pushed: {{}})
        time.sleep(2)
        os._exit(0)
        """)])
    try:
        assert board.accept({1, 2}, timeout=20) == set()
        assert board.send(1, 1, pickle.dumps("late "), None)       # its answer is never read
        assert child.wait(timeout=20) == 0
        assert wait([board.lines[2]], 10), "the ended rank's line did not close"
        assert board.sweep() == {2}
        assert sorted(board.lines) == [1]
        assert not board.send(2, 2, pickle.dumps("cell 2 "), None)
        assert board.send(1, 2, pickle.dumps("cell 2 "), None)
        assert board.receive({1}, 2, timeout=10) == [(1, {"ok": True, "output": "cell 2 ", "samples": []})]
    finally:
        child.kill()
        child.wait()
        board.close()


def test_a_line_that_died_unseen_is_told_from_a_rank_that_died_with_the_cell():
    """A rank says each cell has arrived before it runs it. A line that broke before that (it had
    died unseen, as a cut past the keepalive leaves it on one end only) is ``UNREACHED``: the rank
    never had the cell and may live — rank 0 sends it by actor call. One that breaks after is a
    rank that died with the cell (None)."""
    board = line.Switchboard("127.0.0.1")
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, time
        from gpugeek_jupyter.workers import line
        line.serve({board.address!r}, {board.key!r}, 1, lambda call, pushed: {{}})
        time.sleep(2)
        os._exit(0)
        """)])
    try:
        assert board.accept({1}, timeout=20) == set()
        assert child.wait(timeout=20) == 0
        assert board.send(1, 1, pickle.dumps("pass"), None), "a first write to a line closed at the other end"
        assert board.receive({1}, 1, timeout=10) == [(1, line.UNREACHED)]
        assert board.lines == {}, "the broken line was kept"
    finally:
        child.kill()
        child.wait()
        board.close()


def test_the_lead_line_answers_a_keeper_in_any_order_and_breaks_as_rank_0_goes():
    """A keeper's lead line to rank 0 (``workers/lead.py``): requests answered by id, a slow one
    not holding a quick one; a stranger without the key gets nothing; a rank 0 gone fails what
    waits (the keeper takes it for dead)."""
    import threading

    from gpugeek_jupyter.workers import lead

    release = threading.Event()

    def drain(request):         # a held read (number 0) waits for the release; number -1 fails
        if request.number < 0:
            return 1 / 0
        if request.number == 0:
            release.wait(10)
        return request.cursor * 2

    door = lead.LeadDoor("127.0.0.1", {lead.DrainCell: drain, lead.LeadCell: lambda request: request.call + b"!"})
    with socket.create_connection(door.address) as stranger:      # answers the challenge wrong
        stranger.settimeout(5)
        stranger.sendall(b"\x00\x00\x00\x20" + b"\x00" * 32)
        heard = b""
        while chunk := stranger.recv(4096):
            heard += chunk
    assert heard.endswith(b"#FAILURE#"), heard        # the challenge, then turned away
    keeper = lead.LeadLine(door.address, door.key)
    held = keeper.ask(lead.DrainCell(0.0, 21, 0))
    assert keeper.ask(lead.LeadCell(b"cell")).result(timeout=5) == b"cell!" and not held.done()
    release.set()
    assert held.result(timeout=5) == 42
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        keeper.ask(lead.DrainCell(0.0, 1, -1)).result(timeout=5)
    again = lead.LeadLine(door.address, door.key)       # a keeper that started again
    assert again.ask(lead.DrainCell(0.0, 2, 1)).result(timeout=5) == 4
    release.clear()
    pending = again.ask(lead.DrainCell(0.0, 1, 0))
    door.close()                  # rank 0's process going: every keeper's end sees it
    with pytest.raises(ConnectionError):
        pending.result(timeout=5)
    with pytest.raises(ConnectionError):
        keeper.ask(lead.LeadCell(b"late")).result(timeout=5)   # broken stays broken: asked again, failed at once
    release.set()
    keeper.close()
    again.close()
