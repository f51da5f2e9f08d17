"""A kernel on the line to a cluster's keeper, with the head on this machine (``heads.py``: started
as a remote head is, the keeper run from the archive sent to the head). The kernel is no Ray client
of it: cells go as source text, values as data; a cell survives its line breaking and the keeper
dying, runs once, and its output arrives once, in order. (The same through SSH tunnels to hosts of
their own, on another Python: tests/lab/test_other_python.py.)"""

from __future__ import annotations

import linecache
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import heads
import pytest
from cluster_processes import wait_until

import gpugeek_jupyter as gg
from gpugeek_jupyter.cells import jobs
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.group.results import Interrupted
from gpugeek_jupyter.kernel import connection, environment
from gpugeek_jupyter.kernel.session import current
from gpugeek_jupyter.line import messages as m
from gpugeek_jupyter.line.wire import Line
from gpugeek_jupyter.provision.actions import Cluster
from gpugeek_jupyter.raynodes import token_text
from gpugeek_jupyter.remote import tunnel
from gpugeek_jupyter.workers.options import options

pytestmark = pytest.mark.slow

NUMBERED = """
import time
with open({counter!r}, "a") as f:
    f.write(f"{{rank}}\\n")
for i in range({lines}):
    print(f"line {{i}}", flush=True)
    time.sleep({every})
rank * 10
"""


def _no_tunnel(record):
    return record          # the head is on this machine: the keeper's port is dialled as it is


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    home = tmp_path_factory.mktemp("kept-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GPUGEEK_HOME", str(home))
        patch.setattr(tunnel, "ensure", _no_tunnel)
        with heads.head("kept", home) as head:
            try:
                Cluster("kept").connect()
                current().active = "kept"
                yield SimpleNamespace(home=home, head=head)
            finally:
                jobs.reset()
                connection.let_go()
                current().active = current().group = None


@pytest.fixture
def kept(cluster, monkeypatch):
    monkeypatch.setenv("GPUGEEK_HOME", str(cluster.home))
    monkeypatch.setattr(tunnel, "ensure", _no_tunnel)
    return cluster


def notebook_function(source: str):
    """A function as a notebook defines it: in ``__main__``, its source in linecache (IPython's way)."""
    filename = f"<ipython-input-{abs(hash(source))}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    return next(v for k, v in namespace.items() if callable(v) and not k.startswith("__"))


def test_a_module_and_a_folder_of_the_notebooks_reach_the_workers_through_the_keeper(kept, tmp_path, monkeypatch,
                                                                                       capsys):
    """A module beside the notebook that the workers lack goes to the keeper, which gives it to the
    next group; so does ``up --working-dir``'s folder, each cell starting in its copy there."""
    (tmp_path / "notebook_helper.py").write_text("ANSWER = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.csv").write_text("x\n1\n")
    current().line.call(m.Ship(working_dir=environment.packed_folder(str(folder))), 60)
    jobs.reset()                       # the next group takes the folder (first in this file: the
    #                                    group it starts goes on to run the tests after it)
    value = gg.run("import notebook_helper\n(notebook_helper.ANSWER + 1, open('train.csv').read())", workers=2)
    assert value.shown() == (42, "x\n1\n")
    assert "sending notebook_helper (local" in capsys.readouterr().out


def test_a_cell_goes_as_source_and_comes_back_as_data(kept, capsys):
    import pandas as pd
    import ray
    import torch

    assert current().connection.kind == "line"
    from ray.util.client import ray as client

    assert not client.is_connected(), "the kernel is a Ray Client"
    scale = notebook_function("def scale(x):\n    return x * factor\n")
    result = gg.run("factor = 3\nprint('on', rank)\nt = torch.arange(4) + rank\n"
                    "df = __import__('pandas').DataFrame({'rank': [rank]})\nscaled = scale(t)\n6 * 7",
                    workers=2, push={"scale": scale}, pull=["t", "df", "scaled"], all_ranks=True)
    assert result.shown() == 42
    assert torch.equal(result.pulled["t"], torch.arange(4))
    assert torch.equal(result.pulled["scaled"], torch.arange(4) * 3), "the pushed function did not run there"
    assert isinstance(result.pulled["df"], pd.DataFrame) and result.pulled["df"]["rank"].tolist() == [0]
    shown = capsys.readouterr().out
    assert "[rank 0] on 0" in shown and "[rank 1] on 1" in shown
    assert not ray.is_initialized() or connection.connected_address() != ray.get_runtime_context().gcs_address
    on_head = [" ".join(p.cmdline()) for p in kept.head.processes()]
    assert on_head and not [c for c in on_head if "ray_client_server" in c], on_head
    assert any("gpugeek_jupyter.keeper.serve" in c for c in on_head), "no keeper among the head's processes"
    assert "no lead line" not in kept.head.keeper_log, "the keeper reaches rank 0 by Ray calls, not its lead line"


def test_gradient_checkpointing_runs_on_workers_that_have_the_heads_package_alone(kept):
    """The workers of a keeper's group import the package the head was sent (``KEEPER_PACKAGE``):
    ``--grad-ckpt`` finds the model's repeated blocks with ``blocks.py``, which that archive once
    left out (a remote cell with --grad-ckpt or --strategy fsdp then failed to import it)."""
    source = ("from torch import nn\n"
              "class Net(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))\n"
              "net = gg.prepare(Net())\n"
              "type(getattr(net, 'module', net).blocks[0]).__name__")
    assert gg.run(source, workers=2, grad_ckpt=True).shown() == "CheckpointWrapper"


def test_a_function_the_notebook_cannot_send_is_named_in_one_line(kept):
    with pytest.raises(GpugeekError, match=r"--push f: a lambda defined in this notebook"):
        gg.run("f(1)", workers=2, push={"f": eval("lambda x: x", {"__name__": "__main__"})})
    with pytest.raises(GpugeekError, match=r"--push lock: it cannot be sent \(TypeError"):
        gg.run("lock", workers=2, push={"lock": threading.Lock()})


def test_a_line_cut_again_and_again_loses_no_line_and_runs_the_cell_once(kept, capsys, tmp_path):
    """Four cuts while the cell runs, each made once the line is back: the cell prints its lines,
    then waits for the fourth cut (so a slow redial on a loaded machine cannot let it end first)."""
    counter, cuts_done = tmp_path / "ran", tmp_path / "cut"
    line = current().line
    dialled = line.dialled
    stop = threading.Event()

    def cut():
        at = -1                        # the dial count when the line was last cut
        for _ in range(4):
            wait_until(lambda at=at: line.up and line.dialled > at, 60, "the line to come back")
            if stop.wait(0.7):
                return
            at = line.dialled
            line.close()               # as an SSH tunnel dying does: the kernel's end breaks
        cuts_done.touch()

    cutter = threading.Thread(target=cut, daemon=True)
    cutter.start()
    numbered = NUMBERED.format(counter=str(counter), lines=40, every=0.1).removesuffix("rank * 10\n")
    source = numbered + (f"import os\nfor _ in range(900):   # the cuts' end, or 90 s\n"
                         f"    if os.path.exists({str(cuts_done)!r}):\n        break\n    time.sleep(0.1)\nrank * 10\n")
    try:
        result = gg.run(source, workers=2)
    finally:
        stop.set()
        cutter.join()
    assert cuts_done.exists(), "the cell ended before the line was cut four times"
    assert result.shown() == 0
    out = capsys.readouterr().out.splitlines()
    shown = [x for x in out if x.startswith("line ")]
    assert shown == [f"line {i}" for i in range(40)], shown
    assert sorted(counter.read_text().split()) == ["0", "1"], "the cell ran more than once"
    redials = line.dialled - dialled
    assert redials >= 4, f"the line was dialled {redials} times after four cuts"
    said = [x for x in out if "dropped" in x and "dialled again" in x]
    assert 1 <= len(said) <= redials, f"{len(said)} lines said the line dropped, for {redials} redials"


def test_a_cell_sent_twice_runs_once(kept, tmp_path):
    """What the kernel does after a reply was lost: the same cell, by the same id, again."""
    counter = tmp_path / "ran"
    group, _ = jobs.group_for(options(workers=2))
    source = NUMBERED.format(counter=str(counter), lines=3, every=0.1)
    def sent(wait_s: float) -> m.CellNews:
        return current().line.call(m.RunCell(uid="same-id", group_id=group.group_id, source=source,
                                             options=options(workers=2), pull=[], job={}, wait_s=wait_s), 30)

    first, again = sent(0.0), sent(5.0)
    assert again.number == first.number
    news = again
    while news.news.get("outcome") is None:
        news = current().line.call(m.ReadCell(group_id=group.group_id, number=first.number,
                                              cursor=news.news["next"], wait_s=2.0), 30)
    assert sorted(counter.read_text().split()) == ["0", "1"]


def test_the_keeper_killed_mid_cell_starts_again_and_the_cell_picks_up(kept, capsys, tmp_path):
    counter = tmp_path / "ran"
    before = kept.head.keeper_pid()
    assert before is not None

    def kill() -> None:
        time.sleep(2.0)      # mid-cell: the cell prints for 16 s
        os.kill(before, signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()
    result = gg.run(NUMBERED.format(counter=str(counter), lines=80, every=0.2), workers=2)
    assert result.shown() == 0
    out = capsys.readouterr().out
    assert [x for x in out.splitlines() if x.startswith("line ")] == [f"line {i}" for i in range(80)]
    assert "the cluster is out of reach" in out and "is back after" in out, out[-2000:]
    assert sorted(counter.read_text().split()) == ["0", "1"], "the cell ran again"
    after = kept.head.keeper_pid()
    assert after not in (None, before), "the head's watchdog did not start the keeper again"
    assert gg.run("rank + 1", workers=2).shown() == 1, "the group was not found again"


def test_the_stop_button_stops_every_rank_through_the_keeper(kept, stop_button):
    gg.run("kept_variable = 5", workers=2)
    timer = threading.Timer(2.0, stop_button)
    timer.start()
    began = time.monotonic()
    with pytest.raises(Interrupted, match="interrupted on all 2 workers — the group is ready"):
        gg.run("import time\nwhile True:\n    time.sleep(0.01)", workers=2)
    took = time.monotonic() - began - 2.0
    assert took < 1.5, f"every rank stopped {took:.1f} s after the button"
    assert gg.run("kept_variable", workers=2).shown() == 5, "the group lost its variables"


def test_a_job_of_a_kernel_that_died_is_listed_and_followed_from_another(kept, tmp_path):
    jobs.reset()         # this kernel's group gives the other kernel its room
    code = ("from gpugeek_jupyter.remote import tunnel\ntunnel.ensure = lambda record: record\n"
            "import gpugeek_jupyter as gg\ngg.up('kept')\n"
            "gg.run('import time\\nfor i in range(30):\\n    print(\"step\", i, flush=True)\\n    time.sleep(0.2)\\n"
            "answer = 41 + 1', name='long-job', workers=2, pull=['answer'])\n")
    kernel = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "GPUGEEK_HOME": str(kept.home)})
    try:
        line = ""
        while "step 3" not in line:
            line = kernel.stdout.readline()
            assert line, kernel.stderr.read()[-3000:]
    finally:
        kernel.kill()
        kernel.wait(10)
    listed = gg.jobs("kept")
    row = listed[listed["name"] == "long-job"].iloc[0]
    assert row["state"] == "running", listed
    result = gg.attach("long-job", "kept")
    assert result.pulled == {"answer": 42}


def test_doctor_examines_the_nodes_from_the_head_and_names_both_ends(kept):
    report = gg.doctor("kept")
    assert report.ok, repr(report)
    assert set(report.sides) == {"kernel", "head"} and f"protocol {m.PROTOCOL}" in report.sides["head"], report.sides
    assert f"Python {sys.version.split()[0]}" in report.sides["kernel"]


def test_a_kernel_of_another_protocol_is_refused_by_the_keeper_in_one_line(kept):
    spec_line = registry.live("kept").spec["remote"]["line_address"]
    host, _, port = spec_line.rpartition(":")
    line = Line(lambda: socket.create_connection((host, int(port)), timeout=5), token_text(),
                m.Hello(protocol=m.PROTOCOL - 1, package="9.9", python="3.99.0", ray=None, kernel="elsewhere:1"))
    with pytest.raises(GpugeekError, match=f"link version {m.PROTOCOL} there, "
                                           f"{m.PROTOCOL - 1} here"):
        line.open()


def test_up_workers_starts_the_group_on_the_keeper_while_up_returns(kept):
    jobs.reset()
    began = time.monotonic()
    jobs.warm_start(registry.live("kept"), 2)
    returned = time.monotonic() - began
    assert returned < 2.0, f"warm_start waited {returned:.1f} s for the group"
    wait_until(lambda: "warm group" in kept.head.keeper_log and "is ready" in kept.head.keeper_log, 60,
               "the warm group's start on the keeper")
    began = time.monotonic()
    assert gg.run("rank", workers=2).shown() == 0
    assert time.monotonic() - began < 3.0, "the first cell waited for a group to start"
