"""One worker of the group: a Ray actor holding a ``torch.distributed`` rank and a namespace.

The process group is initialised once, when the group is built; every cell after that is just
source sent to the actor and run with ``exec`` in the namespace, which persists between cells.
The actor has two threads (``max_concurrency=2``): one runs the cell (on a rank other than 0,
the cell line's own thread runs it when the cell came that way), the other answers
``drain`` (output and metrics so far) and ``interrupt``, which raises ``KeyboardInterrupt`` in
the running cell between two bytecodes — the only way found to stop a cell and keep the actor.

Rank 0 also leads: the notebook sends it the cell once (``execute_all``) and it hands the cell to
the other ranks from inside the cluster, over the cell line (``line``), so a cell costs the
notebook one request whatever the group's size — across a network (a Ray Client) and on the
cluster's own (a Ray driver) alike, the quicker way. The lead is where a failing rank stops the
others. Rank 0 runs its cells in a thread of its own, beside the lead, so that a cell stuck in a
collective cannot keep the lead from answering.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import sys
import threading
import time
from concurrent import futures
from typing import TYPE_CHECKING

from .. import ports
from ..errors import GpugeekError
from ..launch import frameworks, rendezvous, torchrun
from . import files, journal, lead, line, notice, oom, outcome, progress, values
from .cell import Cell, on_cpu, portable, user_traceback
from .helper import Helper
from .options import CellCall, RunOptions
from .outcome import CANCEL_WAIT_S, for_peers

if TYPE_CHECKING:
    from ..line.news import LeadWord

LEAD_THREADS = 4        # rank 0's actor threads: the lead, a drain that waits, interrupt, one spare
                        # (its cell has its own)
LEAD_POLL_S = 0.05      # while rank 0's own cell runs, the lead looks at it this often


class Worker:
    def __init__(self):
        self._outbox = progress.Outbox()      # output and reports until the notebook asks
        self._thread: int | None = None
        self._cell: int | None = None      # which cell ``_thread`` runs: a late interrupt misses
        self._switch = threading.Lock()
        self._interrupted_upto = 0         # an interrupt that came before its cell still counts
        self._peers: list = []             # rank 0: the others' handles, ranks 1..n-1
        self._cell_thread: futures.ThreadPoolExecutor | None = None   # rank 0: runs its cells
        self._switchboard: line.Switchboard | None = None   # rank 0: the other ranks' cell lines
        self._lead_door: lead.LeadDoor | None = None   # rank 0: where a keeper's lead line comes in
        self._nodes = progress.Nodes()     # rank 0: the node samplers, asked on the notebook's behalf
        self._journals = journal.Journals()   # rank 0: what its cells sent home, kept for the notebook
        self._scribe: journal.Scribe | None = None   # rank 0: drains its journals while nobody reads
        self.ns: dict = {}
        self.rank = -1
        self.described: dict = {}          # what ``setup`` said of this rank
        self.env: dict[str, str] = {}      # this rank's ``torchrun`` variables (``launch``)
        self.owner: str | None = None      # rank 0: the kernel that adopted the group (``group/orphans.py``)

    def node_address(self) -> tuple[str, int]:
        """This node's address and a free port on it: rank 0 hosts the rendezvous."""
        import ray

        return ray.util.get_node_ip_address(), ports.free_port("")

    def open_lead(self) -> tuple[tuple[str, int], bytes]:
        """Rank 0: listen for a keeper's lead line (``lead``), which leads cells and reads their
        journals without a Ray call each; its address and key."""
        import ray

        if self._lead_door is None:
            self._lead_door = lead.LeadDoor(ray.util.get_node_ip_address(),
                                            {lead.LeadCell: lambda r: self.execute_all(r.call, r.pushed),
                                             lead.DrainCell: lambda r: self.drain_all(r.wait_s, r.cursor, r.number)})
        return self._lead_door.address, self._lead_door.key

    def open_line(self) -> tuple[tuple[str, int], bytes]:
        """Rank 0: listen for the other ranks' cell lines (``line``); their address and key."""
        import ray

        self._switchboard = line.Switchboard(ray.util.get_node_ip_address())
        return self._switchboard.address, self._switchboard.key

    def where(self) -> tuple[str, list]:
        """This worker's node and the GPU ids Ray gave it: what its ``torchrun`` variables follow."""
        import ray

        return ray.get_runtime_context().get_node_id(), list(ray.get_gpu_ids())

    def setup(self, rank: int, world_size: int, master: str, port: int, options: RunOptions,
              timeout_s: float = 300.0, cell_line: tuple | None = None, notices: str | None = None,
              env: dict | None = None) -> dict:
        import ray

        self.env = env or {}
        torchrun.apply(self.env)         # before CUDA starts: it reads CUDA_VISIBLE_DEVICES once
        import torch

        gpu_ids = ray.get_gpu_ids()
        note = None
        if gpu_ids and torch.cuda.is_available():
            device = torch.device("cuda", torchrun.device_index(self.env))   # its own GPU
            torch.cuda.set_device(device)
            backend = "nccl"
            if 0 < options.gpus_per_worker < 1:       # NCCL wants one GPU per rank
                backend = "gloo"
                note = "workers share GPUs (--gpus-per-worker < 1): gloo instead of NCCL"
        else:
            device, backend = torch.device("cpu"), "gloo"
            if gpu_ids:
                note = "the cluster's GPUs are declared, not real (simulated nodes): running on CPU with gloo"
        serve_line = (lambda: line.serve(*cell_line, rank, self.execute)) if cell_line is not None else None
        rendezvous.join(backend, rank, world_size, master, port, timeout_s, reached=serve_line)
        torchrun.keep_group(backend)     # a framework's init or destroy finds the warm group
        self.rank = rank
        helper = Helper(rank, world_size, device, options, self._outbox.report)
        frameworks.watch(helper)       # Trainer, Accelerate, Lightning report through gg
        node_id = ray.get_runtime_context().get_node_id()
        if notices:             # where this node's preemption notice comes from (sim, aws, gcp, azure)
            helper.notice = notice.NoticeWatch(notices, node_id)
        self.ns = {"__name__": "__main__", "gg": helper, "rank": rank, "world_size": world_size,
                   "device": device, "torch": torch}
        self.described = {"rank": rank, "device": str(device), "backend": backend, "note": note,
                          "pid": os.getpid(), "node_id": node_id, "ip": ray.util.get_node_ip_address()}
        return self.described

    def execute(self, call: bytes, pushed: bytes | None = None) -> dict:
        """Run one cell; never raises — the result says what happened. ``call`` is the pickled
        ``CellCall``: one argument, as Ray serialises each argument on its own. Another rank's
        cell comes this way (over the cell line, or by actor call); rank 0's own is run by its
        lead (``execute_all``)."""
        return self._execute(pickle.loads(call), pushed)

    def _execute(self, cell: CellCall, pushed: bytes | None) -> dict:
        stdout, stderr = sys.stdout, sys.stderr
        result = None
        while True:    # an interrupt can land anywhere until the door is shut: then go round again
            try:
                if result is None:
                    sys.stdout = sys.stderr = progress.Stream(self._outbox)
                    self._outbox.begin()
                    result = self._run(cell, pushed)
                self._stop_interrupts()
                sys.stdout, sys.stderr = stdout, stderr
                result.update(self.drain())
                self._outbox.end()
                return result
            except KeyboardInterrupt:
                result = result or {"ok": False, "interrupted": True}

    def _run(self, call: CellCall, pushed: bytes | None) -> dict:
        options, cell_id = call.options, call.cell_id
        cell = Cell(call.source, call.filename)
        cell.register()
        result: dict = {"ok": True}
        with self._switch:
            self._thread, self._cell = threading.get_ident(), cell_id
            stopped = cell_id <= self._interrupted_upto
        try:
            if stopped:
                raise KeyboardInterrupt
            self.ns["gg"].configure(options)
            if frameworks.loaded():
                torchrun.apply(self.env)
            if options.folder:               # a cluster on the notebook's machine: the notebook's folder
                files.enter(options.folder)
            began = time.time()
            if pushed:
                self.ns.update(values.load(pushed, self.ns))
            try:
                if options.argv is not None:      # a script (``%gpugeek torchrun``): whole, its own argv
                    value = torchrun.run_script(compile(cell.source, cell.filename, "exec"), self.ns, options.argv,
                                                options.script_dir)
                else:
                    body, last = cell.compile()
                    exec(body, self.ns)
                    value = eval(last, self.ns) if last is not None else None
            except SystemExit as exit_:           # a pasted script's ``sys.exit(main())``: as torchrun has it
                value = None
                if exit_.code not in (None, 0):
                    raise _exited(options.argv[0] if options.argv is not None else "the cell", exit_.code,
                                  self.rank) from None
            self.ns["gg"].flush()
            if options.name_writes:
                result["wrote"] = files.report(began, self.described.get("ip"))
            if call.want_value and value is not None:
                result["value"] = portable(value)
            if call.pull:
                missing = [name for name in call.pull if name not in self.ns]
                if missing:
                    raise NameError(f"--pull: no variable {', '.join(missing)} on rank {self.rank}")
                result["pulled"] = {name: values.dumps(on_cpu(self.ns[name])) for name in call.pull}
        except KeyboardInterrupt:
            result = {"ok": False, "interrupted": True}
        except notice.Preempted as exc:       # every rank stops at the same step, checkpointed
            watch = self.ns["gg"].notice
            result = {"ok": False, "error": user_traceback(exc), "type": "Preempted",
                      "preempted": {"step": exc.step, "deadline": exc.deadline,
                                    "node": watch.node_id if watch is not None and watch.deadline else None}}
        except BaseException as exc:  # noqa: BLE001 - the user's error, sent back as text
            result = {"ok": False, "error": user_traceback(exc), "type": type(exc).__name__}
            if isinstance(exc, GpugeekError):     # the gg helper's own word: one line, as in the kernel
                result["said"] = str(exc)
            if oom.ran_out(exc):                  # read the GPU now, before the cell's tensors go
                result["memory"] = oom.memory_at(exc, self.ns["device"])
        if "memory" in result:                    # the next cell starts on an emptied GPU
            oom.release(self.ns["device"])
        result["cell"] = cell_id
        return result

    def _stop_interrupts(self) -> None:
        """No interrupt may land after the cell: close the door, then clear any pending one."""
        while True:
            try:
                with self._switch:
                    self._thread = self._cell = None
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)
                return
            except KeyboardInterrupt:  # it landed while we were closing: close again
                continue

    def drain(self) -> dict:
        """This rank's output and reports so far."""
        return self._outbox.take()

    def interrupt(self, cell_id: int) -> bool:
        """Raise KeyboardInterrupt in cell ``cell_id`` if it still runs (lands between bytecodes);
        if it has not started yet (the lead's call and the notebook's interrupt come by different
        ways), it will not run."""
        with self._switch:
            self._interrupted_upto = max(self._interrupted_upto, cell_id)
            if self._thread is None or self._cell != cell_id:
                return False
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread),
                                                       ctypes.py_object(KeyboardInterrupt))
            return True

    def versions(self, names: list[str]) -> dict:
        """The version of each module this worker imports (``kernel/environment.py``)."""
        from ..versions import version_of

        return {name: version_of(name) for name in names}

    def pid(self) -> int:
        return os.getpid()

    def description(self) -> dict:
        """What ``setup`` said of this rank: a kernel that adopts the group reads it here."""
        return self.described

    def adopted(self, owner: str) -> dict:
        """Rank 0: kernel ``owner`` (host:pid) takes the group over; the group's options, samplers."""
        self.owner = owner
        return {"options": self.ns["gg"].options, "samplers": self._nodes.samplers}

    # -- rank 0: the lead -----------------------------------------------------------------------

    def meet(self, peers: list) -> list[int]:
        """Rank 0: the other ranks' actor handles, given once when the group is built, and their
        cell lines taken. Returns the ranks without a line: the lead reaches them by actor call."""
        self._peers = list(peers)
        # one thread for every cell of rank 0, beside the lead (a stuck cell cannot hold the lead)
        self._cell_thread = futures.ThreadPoolExecutor(1, thread_name_prefix="cell")
        return sorted(self._switchboard.accept(set(range(1, len(peers) + 1))))

    def execute_all(self, call: bytes, pushed: list | None = None) -> dict:
        """Rank 0: run the cell on every rank — its own in its cell thread, the others' over the
        cell line (by actor call where there is none) — and wait for them all. A rank that fails
        (or dies) stops the others: they are interrupted and get ``CANCEL_WAIT_S`` to end; any
        still running then is stuck (blocked in a collective), and is named so the group can be
        stopped.

        Returns {"results": {rank: execute's result}, "failed": the rank whose error ended the
        cell, "dead": the rank found dead, "stuck": [ranks]} — never raises."""
        self._outbox.begin()     # a drain held on rank 0 is answered when every rank is done
        try:
            mine: CellCall = pickle.loads(call)
            return self._journaled(mine.cell_id, mine.job or {}, lambda: self._lead(mine, pushed), dict)
        finally:
            self._outbox.end(lead=True)

    def _journaled(self, cell_id: int, job: dict, run, outcome_of) -> dict:
        """``run()`` with the cell's journal open and rank 0's scribe draining it while nobody
        reads; the journal ends with ``outcome_of(run's result)``."""
        kept = self._journals.open(cell_id, job)
        if self._scribe is None:
            self._scribe = journal.Scribe(lambda kept: kept.take(lambda: self._gather(None)),
                                          report=journal.tell_watchdogs)
        self._scribe.keep(kept)
        ended = None
        try:
            result = run()
            ended = outcome_of(result)
            return result
        finally:
            self._scribe.release(kept)
            kept.end(ended or outcome.fresh(dead=0))
            self._scribe.tell_soon(kept)      # its end: the idle clock starts there

    def _lead(self, mine: CellCall, pushed: list | None) -> dict:
        import ray

        cell_id = mine.cell_id
        theirs = for_peers(mine)
        extra = tuple(pushed or ())
        board = self._switchboard
        ended = outcome.fresh()
        lined = {}       # rank → rank: the ranks that got the cell over their line
        called = {}      # actor call → rank: the others (no line, or one that broke while idle)
        if board is not None:
            data = _bytes(extra[0]) if extra else None
            board.sweep()
            for rank in range(1, len(self._peers) + 1):
                if board.send(rank, cell_id, theirs, data):
                    lined[rank] = rank
                else:
                    called[self._peers[rank - 1].execute.remote(theirs, *extra)] = rank
            own = self._cell_thread.submit(self._execute, mine, data)
        else:
            called = {peer.execute.remote(theirs, *extra): rank for rank, peer in enumerate(self._peers, 1)}
            own = self._cell_thread.submit(self._execute, mine, *(_bytes(extra[0]),) if extra else ())
        deadline = None
        while True:
            if own is not None and own.done():
                outcome.judge(0, own.result(), ended)     # execute never raises
                own = None
            if own is None and not lined and not called:
                break
            if deadline is None and (ended["failed"] is not None or ended["dead"] is not None):
                deadline = time.monotonic() + CANCEL_WAIT_S
                if own is not None:
                    self.interrupt(cell_id)
                for rank in (*lined.values(), *called.values()):
                    self._peers[rank - 1].interrupt.remote(cell_id)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            if lined or called:     # rank 0's own cell (or the other way's ranks) looked at now and then
                wait = LEAD_POLL_S if own is not None or (lined and called) else left
                wait = wait if left is None or wait is None else min(wait, left)
                if lined:
                    for rank, result in board.receive(set(lined), cell_id, wait):
                        del lined[rank]
                        if result is None:
                            outcome.died(rank, ended)
                        elif result == line.UNREACHED:     # its line had died unseen: the rank may live
                            called[self._peers[rank - 1].execute.remote(theirs, *extra)] = rank
                        else:
                            outcome.judge(rank, result, ended)
                if called:
                    done, _ = ray.wait(list(called), num_returns=1, timeout=0 if lined else wait)
                    for ref in done:
                        outcome.collect(called.pop(ref), ref, ended)
            else:
                futures.wait([own], timeout=left)
        ended["stuck"] = sorted(([0] if own is not None else []) + [*lined.values(), *called.values()])
        return ended

    def keep_samplers(self, samplers: list, every: float) -> None:
        """Rank 0: the node samplers, which it asks with the ranks (``drain_all``, ``node_reports``)."""
        self._nodes = progress.Nodes(samplers, every)

    def drain_all(self, wait_s: float = 0.0, since: int | None = None, cell_id: int | None = None) -> dict:
        """Rank 0: every rank's output and reports so far, and the node samplers' when due; held
        up to ``wait_s`` for rank 0's cell to print or end (``progress.gather``). With ``since``,
        what the cell's journal holds from that cursor on (``journal.Journal.since``): what the
        scribe took meanwhile too."""
        if since is None or cell_id is None:
            return self._gather(wait_s)
        kept = self._journals.open(cell_id)       # a drain can come before its cell: it is kept too
        kept.read_at = time.monotonic()        # the keeper leaves the drains to this reader
        kept.take(lambda: self._gather(wait_s))
        return kept.since(since)

    def _gather(self, wait_s: float | None) -> dict:
        return progress.gather(self._outbox, self._peers, self._nodes, wait_s)

    def state(self) -> LeadWord:
        """Rank 0: its latest cell, whether it still runs, and its latest step."""
        kept = self._journals.get()
        return {"cell": kept.cell_id if kept else None, "job": kept.job if kept else None,
                "running": bool(kept and kept.outcome is None),
                "step": kept.step if kept else None, "began": kept.began if kept else None,
                "ended": kept.ended if kept else None, "owner": self.owner}

    def jobs(self) -> list[dict]:
        """Rank 0: the cells it keeps journals of, as jobs (``cells/attach.py``)."""
        return self._journals.summaries()

    def journal(self, cell_id: int | None, since: int = 0, wait_s: float = 0.0) -> dict | None:
        """Rank 0: the cell's journal from ``since`` on, held up to ``wait_s`` for news — for a
        notebook that lost its drain (its link went down) or attaches later. None: no such cell
        is kept."""
        kept = self._journals.get(cell_id)
        return kept.since(since, wait_s) if kept is not None else None

    def node_reports(self) -> list[dict]:
        """Rank 0: the node samplers' reports, asked from inside the cluster."""
        return self._nodes.collect(self._nodes.ask(now=True))


def _bytes(pushed) -> bytes:
    """Pushed variables as they came: bytes over a keeper's lead line, a Ray object by actor call."""
    if isinstance(pushed, bytes):
        return pushed
    import ray

    return ray.get(pushed)


def _exited(what: str, code, rank: int) -> GpugeekError:
    """A cell or a script that ended with ``sys.exit(non-zero)``: a failure, as torchrun has it."""
    return GpugeekError(f"{what} exited with {code!r} on rank {rank} (sys.exit(0) or sys.exit() ends it as a "
                        "success) — fix what it exited on, or end it so")
