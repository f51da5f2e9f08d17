"""What a running cell sends home, and how it gets there in as few requests as can be.

Every rank keeps its output and ``gg`` reports in an ``Outbox`` until asked. The notebook asks
rank 0 alone (``gather``), which asks the other ranks and the node samplers from inside the
cluster and answers for them all: one request from the notebook, whatever the group's size and
however many nodes are sampled. Rank 0 holds the ask until its cell prints something or ends, or
``wait_s`` passes — a cell that prints nothing costs the notebook about one request a second, and
a print still shows within a moment. On a Ray Client each request crosses the network and goes
through the cluster's client server, whose CPU is the training's.
"""

from __future__ import annotations

import threading
import time

PEER_TIMEOUT_S = 5.0      # a rank that does not answer within this is left out of the reply
NODE_TIMEOUT_S = 0.5      # samplers that do not answer within this report next time
ANSWER_WITHIN_S = PEER_TIMEOUT_S + NODE_TIMEOUT_S + 5.0   # rank 0's answer, after its wait: else it is gone


class Outbox:
    """A rank's output and reports since they were last taken. Rank 0's also wakes an ask that
    waits on it (``gather``): on output, and when the cell ends."""

    def __init__(self):
        self._lock = threading.Lock()
        self._output: list[str] = []
        self._samples: list[dict] = []
        self._news = threading.Event()
        self._open = 0       # cells (and rank 0's lead) running now: begin() and end() nest

    def write(self, text: str) -> None:
        with self._lock:
            self._output.append(text)
        self._news.set()

    def report(self, sample: dict) -> None:
        """A ``gg`` report: no wake-up, reports come at most once a second and so do the asks."""
        with self._lock:
            self._samples.append(sample)

    def take(self) -> dict:
        with self._lock:
            output, samples = "".join(self._output), list(self._samples)
            self._output.clear()
            self._samples.clear()
        return {"output": output, "samples": samples}

    def begin(self) -> None:
        with self._lock:
            self._open += 1

    def end(self, lead: bool = False) -> None:
        """A cell ended; the last one to end wakes a waiting ask. On rank 0 that is the lead
        (``lead``), which waits for every rank and has the cell's answer, even if rank 0's own
        cell is stuck (its group is then stopped)."""
        with self._lock:
            self._open = 0 if lead else max(0, self._open - 1)
            last = self._open == 0
        if last:
            self._news.set()

    @property
    def running(self) -> bool:
        return self._open > 0

    def wait(self, seconds: float | None) -> None:
        """Until there is output, the cell has ended, or ``seconds`` passed (not at all between
        cells). None: not at all, and what woke a waiting ask stays for it (the journal's scribe)."""
        if seconds is None:
            return
        if self.running and seconds > 0:
            self._news.wait(seconds)
        self._news.clear()


class Stream:
    """Stands in for sys.stdout/stderr while a cell runs."""

    def __init__(self, outbox: Outbox):
        self._outbox = outbox

    def write(self, text: str) -> int:
        self._outbox.write(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def gather(own: Outbox, peers: list, nodes: Nodes, wait_s: float | None = 0.0) -> dict:
    """Rank 0's answer to the notebook: {"ranks": {rank: Outbox.take()}, "nodes": [node samples],
    "running": whether its cell (the lead, on a Ray Client) still runs — if not, the cell's own
    answer is there to take, and until then the notebook need ask nothing else}.
    The others are asked after the wait, all at once, and the samplers with them if their last
    ask is a second old; a rank that does not answer within ``PEER_TIMEOUT_S`` is left out (a
    dying one shows up through the cell's outcome)."""
    import ray

    own.wait(wait_s)
    refs = {peer.drain.remote(): rank for rank, peer in enumerate(peers, 1)}
    asked = nodes.ask()
    ranks = {0: own.take()}
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=PEER_TIMEOUT_S) if refs else ([], [])
    for ref in ready:
        try:
            ranks[refs[ref]] = ray.get(ref)
        except Exception:  # noqa: BLE001 - see above
            pass
    return {"ranks": ranks, "nodes": nodes.collect(asked), "running": own.running}


class Nodes:
    """Rank 0's node samplers. They sample at most once a second, so they are asked no more often.
    An answer that comes late is taken with the next one: a sampler empties its buffer when it
    answers, so an answer left behind would be samples lost."""

    def __init__(self, samplers: list | None = None, every: float = 1.0):
        self.samplers, self.every = list(samplers or []), every
        self._asked_at = float("-inf")
        self._late: dict = {}           # ref → sampler: asked before, not answered yet
        self._lock = threading.Lock()   # the lead's threads ask at once: a drain, a report between cells

    def ask(self, now: bool = False) -> dict:
        """Ask every sampler for its reports if due (or ``now``): {ref: sampler}. One whose last
        answer is still out is not asked again until it comes."""
        at = time.monotonic()
        if not self.samplers or (not now and at - self._asked_at < self.every * 0.9):   # 0.9: timers jitter
            return {}
        self._asked_at = at
        with self._lock:
            waiting = set(map(id, self._late.values()))
        return {s.drain.remote(): s for s in self.samplers if id(s) not in waiting}

    def collect(self, asked: dict, timeout: float = NODE_TIMEOUT_S) -> list[dict]:
        """The reports of the samplers asked now that answered within ``timeout``, and of those
        asked before that have answered since (no wait for those: a slow sampler must not hold
        up the ranks' output). Answers still out are kept for the next time; a sampler whose
        node is gone is asked no more."""
        import ray

        ready, late = ray.wait(list(asked), num_returns=len(asked), timeout=timeout) if asked else ([], [])
        with self._lock:
            before, self._late = self._late, {}
        if before:
            answered, still = ray.wait(list(before), num_returns=len(before), timeout=0)
            ready, late, asked = ready + answered, late + still, {**asked, **before}
        with self._lock:
            self._late.update({ref: asked[ref] for ref in late})
        samples = []
        for ref in ready:
            try:
                samples.extend(ray.get(ref))
            except ray.exceptions.RayActorError:   # its node is gone
                if asked[ref] in self.samplers:
                    self.samplers.remove(asked[ref])
            except Exception:  # noqa: BLE001 - one bad answer costs that sampler's batch only
                pass
        return samples
