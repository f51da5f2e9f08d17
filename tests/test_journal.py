"""Rank 0's journal of a cell, alone (no Ray): a reader from any cursor gets what it missed, in
order; the bound drops the oldest drains and says how many; the keeper drains while nobody reads
and tells the watchdogs; a drain that comes before its cell is kept."""

from __future__ import annotations

import threading
import time

from cluster_processes import wait_until

from gpugeek_jupyter.workers import journal
from gpugeek_jupyter.workers.journal import Journal, Journals, Keeper


def _drain(text: str, step: int | None = None, rank: int = 0) -> dict:
    samples = [{"rank": rank, "step": step}] if step is not None else []
    return {"ranks": {rank: {"output": text, "samples": samples}}, "nodes": [], "running": True}


def test_a_reader_from_any_cursor_gets_what_it_missed_in_order():
    kept = Journal(1, {"id": "j1", "name": "train"})
    for i in range(5):
        kept.add(_drain(f"line {i}\n", step=i, rank=i % 2))
    kept.add(_drain(""))                          # nothing in it: not an entry
    first = kept.since(0)
    assert first["next"] == 5 and first["dropped"] == 0 and first["running"] and first["step"] == 4
    assert first["ranks"][0]["output"] == "line 0\nline 2\nline 4\n"
    assert first["ranks"][1]["output"] == "line 1\nline 3\n"
    later = kept.since(3)
    assert later["ranks"][1]["output"] == "line 3\n" and later["ranks"][0]["output"] == "line 4\n"
    kept.end({"results": {0: {"ok": True}}, "failed": None, "dead": None, "stuck": []})
    done = kept.since(5)
    assert not done["running"] and done["outcome"]["results"][0]["ok"] and kept.state == "finished"
    assert done["ranks"] == {}


def test_the_bound_drops_the_oldest_and_says_how_many(monkeypatch):
    monkeypatch.setattr(journal, "BOUND_BYTES", 1000)
    kept = Journal(1)
    for i in range(10):
        kept.add(_drain(f"{i}" * 300))
    read = kept.since(0)
    assert read["dropped"] == 7 and read["ranks"][0]["output"] == "7" * 300 + "8" * 300 + "9" * 300
    assert kept.since(8)["dropped"] == 0


def test_a_held_read_wakes_on_news_and_on_the_end():
    kept = Journal(1)
    threading.Timer(0.2, lambda: kept.add(_drain("late\n"))).start()
    began = time.monotonic()
    read = kept.since(0, wait_s=5)
    assert read["ranks"][0]["output"] == "late\n" and time.monotonic() - began < 2
    threading.Timer(0.2, lambda: kept.end({"results": {}, "failed": None, "dead": None, "stuck": []})).start()
    assert kept.since(1, wait_s=5)["outcome"] is not None


def test_the_keeper_drains_while_nobody_reads_and_tells_that_the_job_works(monkeypatch):
    monkeypatch.setattr(journal, "KEEP_EVERY_S", 0.2)
    kept = Journal(1, {"id": "j1", "name": "train"})
    told = []
    drains = iter(range(1000))
    keeper = Keeper(lambda k: k.add(_drain(f"{next(drains)}\n", step=3)), report=lambda j: told.append(
        journal.told(j)))
    keeper.keep(kept)
    deadline = time.monotonic() + 5
    while kept.next < 3 and time.monotonic() < deadline:
        time.sleep(0.05)          # the keeper's own pace: polled
    assert kept.next >= 3, "the keeper did not drain while nobody read"
    keeper.release(kept)
    drained = kept.next
    assert told and told[-1]["running"] is True and told[-1]["job"] == "j1" and told[-1]["step"] == 3
    time.sleep(3 * journal.KEEP_EVERY_S)     # nothing to poll for: no drain may come after the release
    assert kept.next == drained


def test_a_journaled_cell_tells_its_end_after_it_ended(monkeypatch):
    """The watchdogs start the idle clock at a job's end: the last word they get must say it ended."""
    from gpugeek_jupyter.workers.worker import Worker

    told = []
    monkeypatch.setattr(journal, "tell_watchdogs", lambda kept: told.append(journal.told(kept)))
    worker = Worker()
    worker._journaled(1, {"id": "j1", "name": "train"}, lambda: {"ok": True},
                      lambda result: {"results": {0: result}, "failed": None, "dead": None, "stuck": []})
    last = wait_until(lambda: told and told[-1]["job"] == "j1" and told[-1], 5, "the end told (off the cell's path)")
    assert last["running"] is False and last["state"] == "finished" and last["ended"] is not None
    # the last step is in the ranks' last reports, which come with the outcome, not a drain
    worker._journaled(2, {"id": "j2"}, lambda: {"ok": True, "samples": [{"rank": 0, "step": 40}]},
                      lambda result: {"results": {0: result}, "failed": None, "dead": None, "stuck": []})
    assert wait_until(lambda: told[-1]["job"] == "j2" and told[-1], 5, "the second end told")["step"] == 40


def test_cells_ending_back_to_back_are_told_once_a_beat_the_last_one(monkeypatch):
    """A cell's end reaches the watchdogs within half a keeping period, off the cell's path; ten
    quick cells cost one write to the cluster's store, not ten, and it names the last."""
    monkeypatch.setattr(journal, "KEEP_EVERY_S", 0.4)
    told = []
    keeper = Keeper(lambda k: None, report=lambda j: told.append(journal.told(j)))
    for cell in range(1, 11):
        kept = Journal(cell, {"id": f"j{cell}"})
        kept.end({"results": {}, "failed": None, "dead": None, "stuck": []})
        keeper.tell_soon(kept)
    last = wait_until(lambda: told and told[-1], 2, "the last end told")
    assert last["job"] == "j10" and last["running"] is False
    time.sleep(2 * journal.KEEP_EVERY_S)     # nothing to poll for: no second tell may come
    assert len(told) == 1, told


def test_a_drain_before_its_cell_is_kept_and_old_cells_go():
    kept = Journals()
    early = kept.open(1)
    early.add(_drain("before the cell\n"))
    assert kept.open(1, {"id": "j1"}) is early and early.job == {"id": "j1"}
    for cell in range(2, 2 + journal.CELLS_KEPT):
        kept.open(cell)
    assert kept.get(1) is None and kept.get().cell_id == 1 + journal.CELLS_KEPT
    assert [s["cell"] for s in kept.summaries()] == list(range(2, 2 + journal.CELLS_KEPT))


class _Peer:
    """A rank as rank 0's keeper asks it (``Worker.ended``), with Ray's call and get played by
    hand: it has each cell's result once the cell is in ``done``; every request is counted."""

    def __init__(self, done: set[int], dead: bool = False):
        self.done, self.dead, self.asked = done, dead, []
        self.ended = self

    def remote(self, cell_ids: list[int]):
        self.asked.append(list(cell_ids))
        if self.dead:
            raise RuntimeError("the actor died")
        return [{"ok": True, "output": f"rank 1, cell {c}"} if c in self.done else None for c in cell_ids]


def test_cells_ending_back_to_back_ask_each_rank_once_for_all_of_them(monkeypatch):
    """Rank 0 ends a cell's journal with the other ranks' results: cells that ended meanwhile cost
    each rank one request together, the journals end in order as their results come, and a rank
    that died is named dead in every one of them."""
    import ray

    from gpugeek_jupyter.workers import outcome

    monkeypatch.setattr(ray, "get", lambda got, timeout=None: got)
    monkeypatch.setattr(journal, "PEERS_POLL_S", 0.01)
    told = []
    ends = [(Journal(cell, {"id": f"j{cell}"}), outcome.fresh()) for cell in (1, 2, 3)]
    peer = _Peer({1, 2})
    threading.Timer(0.05, lambda: peer.done.add(3)).start()      # cell 3 still ends on rank 1
    journal.end_with_peers(ends, [peer], told.append)
    assert peer.asked[0] == [1, 2, 3] and all(ask == [3] for ask in peer.asked[1:]), peer.asked
    assert [kept.cell_id for kept in told] == [1, 2, 3], "the journals end in the order their cells ran"
    assert all(kept.outcome["results"][1]["output"] == f"rank 1, cell {kept.cell_id}" for kept, _ in ends)

    gone = [(Journal(cell, {"id": f"g{cell}"}), outcome.fresh()) for cell in (4, 5)]
    dead = _Peer(set(), dead=True)
    journal.end_with_peers(gone, [dead], told.append)
    assert dead.asked == [[4, 5]] and [kept.outcome["dead"] for kept, _ in gone] == [1, 1]


def test_a_burst_of_cells_past_what_the_ranks_keep_ends_every_journal_at_once(monkeypatch):
    """Quick cells back to back can end faster than rank 0 asks: by then the other ranks keep only
    the last ``CELLS_KEPT`` results. A result a rank ended but let go is said so, not taken for a
    cell still running (which waited ``PEERS_WAIT_S`` and then called finished cells stuck), and
    the keeper asks only for the journals still kept."""
    import ray

    from gpugeek_jupyter.workers import outcome
    from gpugeek_jupyter.workers.journal import Ended

    monkeypatch.setattr(ray, "get", lambda got, timeout=None: got)
    ended = Ended()
    for cell in range(1, 21):
        ended.keep({"cell": cell, "ok": True, "output": f"rank 1, cell {cell}"})
    assert ended.get(20)["output"] == "rank 1, cell 20" and ended.get(21) is None, "21 has not ended here"
    assert ended.get(3) == {"forgotten": True}

    class Asked:
        def __init__(self):
            self.asked = []
            self.ended = self

        def remote(self, cell_ids):
            self.asked.append(list(cell_ids))
            return [ended.get(c) for c in cell_ids]

    peer = Asked()
    ends = [(Journal(cell, {"id": f"j{cell}"}), outcome.fresh()) for cell in (2, 19, 20)]
    started = time.monotonic()
    journal.end_with_peers(ends, [peer], lambda kept: None)
    assert time.monotonic() - started < 1.0, "nothing waited on the forgotten cell"
    assert [kept.state for kept, _ in ends] == ["finished"] * 3 and peer.asked == [[2, 19, 20]]
    assert 1 not in ends[0][0].outcome["results"], "a forgotten result is left out, not made up"
    assert ends[2][0].outcome["results"][1]["output"] == "rank 1, cell 20"

    keeper = Keeper(lambda k: None)
    burst = [Journal(cell, {"id": f"b{cell}"}) for cell in range(1, 11)]
    peer.asked.clear()
    for kept in burst:
        keeper.end_with_peers(kept, outcome.fresh(), [peer])
    wait_until(lambda: all(kept.outcome is not None for kept in burst), 5, "every journal of the burst ended")
    assert all(len(ask) <= journal.CELLS_KEPT for ask in peer.asked), peer.asked
