"""A kernel newer than its hosts: a notebook on Python 3.13 with pandas 3 (pyenv's, ``make
lab-files``: ``.cache/kernel-313``) drives two lab hosts whose Python is 3.10 with pandas 2.3.3 (a
machine image of pyenv's 3.10, ``.cache/lab-image-310``, mounted at /opt/image: a host's /root is
its own, so pyenv's install there is out of its sight). pandas 3 needs Python >= 3.11, so it cannot
go to the hosts: the kernel says in one line that the hosts' own pandas serves, and never that it
sends its own. A DataFrame made on the hosts (pandas 2) is pulled into pandas 3, one made here is
pushed to pandas 2 and pulled back: each arrives equal, through the version-neutral form of
``workers/values.py`` (a pandas 3 pickle fails in pandas 2: it names pyarrow, or a string array
pandas 2 cannot set up). A DDP cell trains across both hosts, one rank on each (``gg.prepare``,
``gg.steps``, ``gg.backward``: the gradients all-reduced over gloo), and a function of the notebook's
is pushed and called on both (as its source: cloudpickle's by-value code does not load in another
minor); one in Python 3.12's syntax, which 3.10 cannot compile, and a lambda are refused in one line
each. Then ``down``, with nothing left on the hosts."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import netlab
import pytest
from netlab import described, left_on_hosts

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / ".cache" / "kernel-313" / "bin" / "python"
IMAGE = ROOT / ".cache" / "lab-image-310"
CP310 = ROOT / ".cache" / "lab-index" / "made-cp310.json"
RAY_NAMES = ("GetTimeoutError", "RayActorError", "ActorDiedError", "ActorUnavailableError", "RuntimeEnvSetupError",
             "RayTaskError", "RaySystemError", "NodeDiedError", "ObjectLostError", "OutOfMemoryError")

NOTEBOOK = '''
import json, platform, traceback
import pandas as pd
import gpugeek_jupyter as gg


def say(**what):
    print("SAID " + json.dumps(what, default=str), flush=True)


def scaled(values, by=2):
    """A function of this notebook's: pushed to the hosts, called there."""
    match values:
        case [first, *rest]:
            return [round(v * by, 3) for v in (first, *rest)]
        case _:
            return []


def newer[T](value: T) -> list[T]:
    """Python 3.12's syntax (PEP 695): the hosts' Python cannot compile its source."""
    return [value]


def refused(**push):
    try:
        gg.run("None", workers=2, push=push)
        return "sent"
    except Exception as exc:
        return f"{{type(exc).__name__}}: {{exc}}"


def equal(got, expected):
    try:
        pd.testing.assert_frame_equal(got, expected)
        return "equal"
    except AssertionError as exc:
        return str(exc)


try:
    gg.up("skew", backend="ssh", hosts={hosts!r}, ssh_key={key!r}, cpus_per_host=1, usd_per_hour=3.6,
          pip_index_url={index!r}, workers=2)
    made = gg.run("import pandas as pd, platform\\n"
                  "df = pd.DataFrame({{'i': [1, 2, 3], 'f': [0.5, 1.5, float('nan')], 's': ['a', 'b', None]}})\\n"
                  "theirs = (pd.__version__, platform.python_version())", workers=2, pull=["df", "theirs"])
    # pandas 2 keeps strings as objects, its column labels too: what the hosts made, as pandas 3 has it
    expected = pd.DataFrame({{"i": [1, 2, 3], "f": [0.5, 1.5, float("nan")],
                              "s": pd.Series(["a", "b", None], dtype=object)}})
    expected.columns = pd.Index(["i", "f", "s"], dtype=object)
    say(made=equal(made.pulled["df"], expected), theirs=made.pulled["theirs"])
    sent = pd.DataFrame({{"i": [1, 2, 3], "f": [0.5, 1.5, float("nan")], "s": ["a", "b", None]}})
    back = gg.run("import pandas as pd\\ngot = sent.copy()\\nkinds = {{k: str(v) for k, v in got.dtypes.items()}}",
                  workers=2, push={{"sent": sent}}, pull=["got", "kinds"])
    say(back=equal(back.pulled["got"], sent), kinds=back.pulled["kinds"], here=str(sent["s"].dtype),
        mine=(pd.__version__, platform.python_version()))
    say(ddp=gg.run({ddp!r}, workers=2).shown())
    say(lam=refused(f=lambda x: x), newer=refused(newer=newer))
    say(pushed=gg.run({called!r}, workers=2, push={{"scaled": scaled}}).shown())
except Exception as exc:
    say(failed=f"{{type(exc).__name__}}: {{exc}}", trace=traceback.format_exc()[-3000:])
finally:
    gg.down("skew")
say(done=True)
'''


# a DDP training step on each host's rank, each rank on its own data: after gg.backward's all-reduce
# every rank holds the same parameters, those of one model trained on the ranks' averaged gradients
# (``reference``, computed on every rank from the same start); what each rank reports of itself
DDP = """
import platform, socket, torch, torch.distributed as dist
from ray.util import get_node_ip_address


def batches(r):
    return [torch.randn(16, 8, generator=torch.Generator().manual_seed(100 * r + i)) + r for i in range(3)]


torch.manual_seed(rank)     # each rank's own initial weights: DDP's broadcast from rank 0 makes them one
model = torch.nn.Linear(8, 1)
model, optimizer = gg.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
start = [p.detach().clone() for p in model.parameters()]
for batch in gg.steps(batches(rank)):
    gg.backward(model(batch).pow(2).mean())
reference = torch.nn.Linear(8, 1)
with torch.no_grad():
    for p, s in zip(reference.parameters(), start):
        p.copy_(s)
sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
for step in zip(*(batches(r) for r in range(world_size))):
    sgd.zero_grad()
    (sum(reference(b).pow(2).mean() for b in step) / world_size).backward()
    sgd.step()
params = [p.detach().clone() for p in model.parameters()]
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
seen = [None] * world_size
dist.all_gather_object(seen, dict(
    rank=rank, host=socket.gethostname(), ip=get_node_ip_address(), python=platform.python_version(),
    ddp=type(model).__name__, steps=gg.step, moved=not all(torch.equal(a, b) for a, b in zip(params, start)),
    averaged=all(torch.allclose(a, b, atol=1e-6) for a, b in zip(params, reference.parameters())),
    params=[p.flatten().tolist() for p in params]))
dict(backend=dist.get_backend(), world_size=world_size, all_reduced=total.item(), ranks=seen)
"""

# the pushed function, called on each host's rank: what it returned, and where its code came from
CALLED = """
import platform, socket, torch.distributed as dist
seen = [None] * world_size
dist.all_gather_object(seen, dict(rank=rank, host=socket.gethostname(), python=platform.python_version(),
                                  got=scaled([rank, 0.25]), code=scaled.__code__.co_filename))
seen
"""


@pytest.fixture
def skew_lab():
    """Two hosts on the 3.10 image (a lab of its own: the session's hosts run Debian's 3.11)."""
    with netlab.fixture(2, images={"h1": IMAGE, "h2": IMAGE}) as made:
        yield made


def _missing() -> str | None:
    if not os.environ.get("GPUGEEK_PYTHON_SKEW"):
        return ("its files (two venvs of PyPI's CUDA torch) take minutes of every core beside make test's timed "
                "tests: `make python-skew` makes them and runs it")
    if not KERNEL.exists():
        return "no kernel on Python 3.13: `make lab-files` makes .cache/kernel-313 where pyenv has 3.13"
    if not (IMAGE / "made.json").exists():
        return "no Python 3.10 machine image: `make lab-files` makes .cache/lab-image-310 where pyenv has 3.10"
    if not CP310.exists():
        return "the lab's wheel index has no cp310 wheels: `make lab-files`"
    return None


@pytest.mark.timeout(600)
def test_a_kernel_on_313_with_pandas_3_drives_hosts_on_310_with_pandas_2(request, gpugeek_home, tmp_path):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    lab = request.getfixturevalue("skew_lab")
    hosts = lab.hosts
    notebook = tmp_path / "notebook.py"
    notebook.write_text(NOTEBOOK.format(hosts=",".join(f"root@{h.address}" for h in hosts), key=str(lab.key),
                                        index=lab.index_url, ddp=DDP, called=CALLED))
    began = time.monotonic()
    done = subprocess.run([str(KERNEL), str(notebook)], capture_output=True, text=True, timeout=480,
                          env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home), "PYTHONPATH": str(ROOT),
                               "AWS_EC2_METADATA_DISABLED": "true"})
    took = time.monotonic() - began
    lines = done.stdout.splitlines()
    said = {k: v for line in lines if line.startswith("SAID ") for k, v in json.loads(line[5:]).items()}
    everything = done.stdout + done.stderr
    print(f"\nthe kernel's run: {took:.0f} s; {said.get('mine')} kernel, hosts' {said.get('theirs')}")
    print("\n".join(line for line in lines if line.startswith(("SAID", "note:"))))
    if "failed" in said or done.returncode != 0:        # what the head's keeper said, before the lab goes
        for log in sorted(hosts[0].file("/root").rglob("keeper.log")):
            print(f"== {log}\n" + log.read_text(errors="replace")[-3000:])
    assert "failed" not in said, f"{said['failed']}\n{said.get('trace')}\n" + "\n".join(lines[-40:])
    assert done.returncode == 0 and said.get("done"), done.stderr[-3000:]
    assert said["theirs"][0] == "2.3.3" and said["theirs"][1].startswith("3.10."), said
    assert said["mine"][0].startswith("3.") and said["mine"][1].startswith("3.13."), said
    assert said["made"] == "equal", said["made"]
    assert said["back"] == "equal", said["back"]
    ddp = said["ddp"]
    ranks = ddp["ranks"]
    print(f"DDP: {ddp['backend']}, ranks on {[(r['host'], r['ip'], r['python']) for r in ranks]}")
    assert ddp["backend"] == "gloo" and ddp["world_size"] == 2 and ddp["all_reduced"] == 3.0, ddp
    assert [r["rank"] for r in ranks] == [0, 1], ranks
    assert sorted(r["host"] for r in ranks) == sorted(h.name for h in hosts), f"one rank per host: {ranks}"
    assert sorted(r["ip"] for r in ranks) == sorted(h.address for h in hosts), f"one rank per host: {ranks}"
    assert all(r["python"].startswith("3.10.") for r in ranks), ranks
    assert all(r["ddp"] == "DistributedDataParallel" and r["steps"] == 3 for r in ranks), ranks
    assert all(r["moved"] and r["averaged"] for r in ranks), f"the ranks did not train on averaged gradients: {ranks}"
    assert ranks[0]["params"] == ranks[1]["params"], f"the ranks' parameters differ: {ranks}"
    # what cannot go is said in one line, and the group runs the next cell
    assert said["lam"].startswith("GpugeekError: --push f: a lambda defined in this notebook"), said["lam"]
    assert said["newer"].startswith("GpugeekError: --push newer: the workers' Python 3.10 cannot compile its "
                                    "source") and "write it in Python 3.10's syntax" in said["newer"], said["newer"]
    assert "\n" not in said["lam"] + said["newer"], said
    pushed = said["pushed"]
    assert sorted(r["host"] for r in pushed) == sorted(h.name for h in hosts), pushed
    assert all(r["python"].startswith("3.10.") for r in pushed), pushed
    assert [r["got"] for r in pushed] == [[0, 0.5], [2, 0.5]], pushed
    assert all(r["code"] == "<pushed scaled>" for r in pushed), f"the function did not go as its source: {pushed}"
    notes = [line for line in lines if "the cells use the hosts' own pandas 2.3.3" in line]
    assert len(notes) == 1, "\n".join(lines)
    assert "sending pandas" not in everything
    named = [name for name in RAY_NAMES if name in everything]
    assert not named, f"the output names {named}:\n{everything[-4000:]}"
    left = left_on_hosts(lab)
    assert not left, f"processes left on the hosts: {described(left)}"
