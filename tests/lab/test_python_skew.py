"""A kernel newer than its hosts: a notebook on Python 3.13 with pandas 3.1.1 (pyenv's, ``make
lab-files``: ``.cache/kernel-313``) drives two lab hosts whose Python is 3.10 with pandas 2.3.3 (a
machine image of pyenv's 3.10, ``.cache/lab-image-310``, mounted at /opt/image: a host's /root is
its own, so pyenv's install there is out of its sight). pandas 3 needs Python >= 3.11, so it cannot
go to the hosts: the kernel says in one line that the hosts' own pandas serves, and never that it
sends its own. A DataFrame made on the hosts (pandas 2) is pulled into pandas 3, one made here is
pushed to pandas 2 and pulled back: each arrives equal, through the version-neutral form of
``workers/values.py`` (a pandas 3 pickle fails in pandas 2: it names pyarrow, or a string array
pandas 2 cannot set up). Then ``down``, with nothing left on the hosts."""

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
except Exception as exc:
    say(failed=f"{{type(exc).__name__}}: {{exc}}", trace=traceback.format_exc()[-3000:])
finally:
    gg.down("skew")
say(done=True)
'''


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


@pytest.mark.timeout(1500)
def test_a_kernel_on_313_with_pandas_3_drives_hosts_on_310_with_pandas_2(request, gpugeek_home, tmp_path):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    lab = request.getfixturevalue("skew_lab")
    hosts = lab.hosts
    notebook = tmp_path / "notebook.py"
    notebook.write_text(NOTEBOOK.format(hosts=",".join(f"root@{h.address}" for h in hosts), key=str(lab.key),
                                        index=lab.index_url))
    began = time.monotonic()
    done = subprocess.run([str(KERNEL), str(notebook)], capture_output=True, text=True, timeout=1300,
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
    assert said["mine"][0] == "3.1.1" and said["mine"][1].startswith("3.13."), said
    assert said["made"] == "equal", said["made"]
    assert said["back"] == "equal", said["back"]
    notes = [line for line in lines if "the cells use the hosts' own pandas 2.3.3" in line]
    assert len(notes) == 1, "\n".join(lines)
    assert "sending pandas 3.1.1" not in everything and "sending pandas" not in everything
    named = [name for name in RAY_NAMES if name in everything]
    assert not named, f"the output names {named}:\n{everything[-4000:]}"
    left = left_on_hosts(lab)
    assert not left, f"processes left on the hosts: {described(left)}"
