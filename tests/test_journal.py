"""Rank 0's journal of a cell, alone (no Ray): a reader from any cursor gets what it missed, in
order; the bound drops the oldest drains and says how many; the scribe drains while nobody reads
and tells the watchdogs; a drain that comes before its cell is kept."""

from __future__ import annotations

import threading
import time

from cluster_processes import wait_until

from gpugeek_jupyter.workers import journal
from gpugeek_jupyter.workers.journal import Journal, Journals, Scribe


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


def test_two_takers_file_their_takes_in_the_order_they_took_them():
    """The notebook's read and rank 0's scribe both take from the one outbox and file what they
    took: a take that is slow to file must not land after a later one (a cut line once showed
    'line 0' after 'line 5')."""
    kept = Journal(1)
    lines = iter(range(200))
    taking = threading.Lock()

    def gather(pause: float) -> dict:
        with taking:                  # the outbox's own take: one at a time, in order
            text = f"line {next(lines)}\n"
        time.sleep(pause)             # … then the taker is slow to file it
        return _drain(text)

    def taker(pause: float) -> None:
        for _ in range(40):
            kept.take(lambda: gather(pause))

    threads = [threading.Thread(target=taker, args=(p,)) for p in (0.002, 0.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert kept.since(0)["ranks"][0]["output"] == "".join(f"line {i}\n" for i in range(80))


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


def test_the_scribe_drains_while_nobody_reads_and_tells_that_the_job_works(monkeypatch):
    monkeypatch.setattr(journal, "KEEP_EVERY_S", 0.2)
    kept = Journal(1, {"id": "j1", "name": "train"})
    told = []
    drains = iter(range(1000))
    scribe = Scribe(lambda k: k.add(_drain(f"{next(drains)}\n", step=3)), report=lambda j: told.append(
        journal.told(j)))
    scribe.keep(kept)
    deadline = time.monotonic() + 5
    while kept.next < 3 and time.monotonic() < deadline:
        time.sleep(0.05)          # the scribe's own pace: polled
    assert kept.next >= 3, "the scribe did not drain while nobody read"
    scribe.release(kept)
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
    scribe = Scribe(lambda k: None, report=lambda j: told.append(journal.told(j)))
    for cell in range(1, 11):
        kept = Journal(cell, {"id": f"j{cell}"})
        kept.end({"results": {}, "failed": None, "dead": None, "stuck": []})
        scribe.tell_soon(kept)
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


def test_what_rank_0_tells_has_the_shapes_the_line_declares(monkeypatch):
    """``line/news.py`` declares what crosses in ``CellNews``, ``Journal`` and ``GroupState``; the
    dicts rank 0 makes (a journal's read, a cell's outcome, ``Worker.state``) have those keys."""
    from typing import get_type_hints

    from gpugeek_jupyter.line import news
    from gpugeek_jupyter.workers import outcome
    from gpugeek_jupyter.workers.worker import Worker

    def keys(shape) -> set[str]:
        return set(get_type_hints(shape, localns=vars(news)))

    kept = Journal(1, {"id": "j1", "name": "train"})
    kept.add(_drain("x\n", step=3))
    ended = outcome.fresh()
    outcome.judge(0, {"ok": True}, ended)
    kept.end(ended)
    read = kept.since(0)
    assert set(read) == keys(news.News), set(read) ^ keys(news.News)
    assert set(read["ranks"][0]) == keys(news.RankNews) and set(read["outcome"]) == keys(news.Outcome)
    assert news.News.__required_keys__ == {"ranks", "nodes", "running"}, "what every drain carries"
    monkeypatch.setattr(journal, "tell_watchdogs", lambda kept: None)
    worker = Worker()
    worker._journaled(1, {"id": "j1"}, lambda: {"ok": True}, lambda result: {**outcome.fresh(), "results": {0: result}})
    assert set(worker.state()) == keys(news.LeadWord), set(worker.state()) ^ keys(news.LeadWord)
