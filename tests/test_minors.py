"""Every Python the package supports, checked without a lab.

A head runs the package on the host's own Python, which may be the oldest the package allows
(``requires-python``) while the notebook runs the newest: hosts on 3.10 once failed every cluster
at the head's watchdog's import of ``datetime.UTC`` (3.11), and nothing here ran 3.10. So, for each
minor from ``requires-python`` to the newest the classifiers claim (pyenv's interpreters), a bare
interpreter compiles every module, imports the head's part as the head gets it (``package_archive``,
the packages it lacks stood in for) and starts the host's entry points (``tests/minors_check.py``).
``make lint`` runs vermin over the package at the oldest minor: the same rule, read from the source.

    python tests/test_minors.py --oldest        the oldest supported minor, as vermin's target
    python tests/test_minors.py --fits          whether this Python is a supported one (make's venv)
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK = Path(__file__).with_name("minors_check.py")


def supported() -> list[str]:
    """``3.N`` from ``requires-python``'s lower bound to the newest minor the classifiers name."""
    text = (ROOT / "pyproject.toml").read_text()
    oldest = int(re.search(r'requires-python\s*=\s*">=\s*3\.(\d+)', text).group(1))
    newest = max(int(n) for n in re.findall(r'"Programming Language :: Python :: 3\.(\d+)"', text))
    return [f"3.{n}" for n in range(oldest, newest + 1)]


def interpreter(minor: str) -> str | None:
    """pyenv's newest patch release of ``minor``, else one on the PATH."""
    found = sorted(Path.home().glob(f".pyenv/versions/{minor}.*/bin/python{minor}"),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.parent.name)])
    return str(found[-1]) if found else shutil.which(f"python{minor}")


def check(python: str, head: Path, scratch: Path) -> dict:
    done = subprocess.run([python, "-I", str(CHECK), str(head), str(ROOT / "gpugeek_jupyter"), str(scratch)],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env={"PATH": os.environ["PATH"], "AWS_EC2_METADATA_DISABLED": "true"})
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def unpacked(folder: Path) -> Path:
    """The head's part of the package, as ``up`` sends it (``remote/headguard.package_archive``)."""
    from gpugeek_jupyter.remote.headguard import package_archive

    with tarfile.open(fileobj=io.BytesIO(package_archive()), mode="r:gz") as tar:
        tar.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return folder


if __name__ == "__main__":
    if sys.argv[1:] == ["--oldest"]:
        print(supported()[0])
        sys.exit(0)
    if sys.argv[1:] == ["--fits"]:        # make's venv: this Python, or one line saying which to use
        mine, minors = f"{sys.version_info.major}.{sys.version_info.minor}", supported()
        if mine not in minors:
            print(f"make: this package runs on Python {minors[0]}–{minors[-1]}, and {sys.executable} is {mine} — "
                  f"name one of those: make lab PYTHON=python{minors[-1]}", file=sys.stderr)
        sys.exit(0 if mine in minors else 1)


import pytest  # noqa: E402 - the --oldest call above runs without the test environment

MINORS = supported()


def _python(minor: str) -> str:
    python = interpreter(minor)
    if python is None:
        message = f"no Python {minor} here (pyenv install {minor}): the package claims it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.mark.parametrize("minor", MINORS)
def test_the_package_compiles_and_the_heads_part_imports_and_starts_on(minor, tmp_path):
    head = unpacked(tmp_path / "head")
    said = check(_python(minor), head, tmp_path)
    assert said["python"].startswith(minor + "."), said
    assert not said["failed"], f"on Python {said['python']}:\n" + "\n".join(
        f"  {f['where']}: {f['error']}" for f in said["failed"])
    assert said["facts_python"] == said["python"], said     # the host script ran on it, for real
    assert said["imported"] >= 60 and said["compiled"] >= 150, said


def test_the_check_fails_where_the_head_imports_what_its_oldest_python_lacks(tmp_path):
    """The failure the check exists for, put back in a copy of the head's part: the 3.10 head's
    watchdog imported ``datetime.UTC`` through the clouds' code."""
    head = unpacked(tmp_path / "head")
    aws = head / "gpugeek_jupyter" / "clouds" / "aws.py"
    aws.write_text(aws.read_text().replace("from datetime import datetime, timezone",
                                           "from datetime import UTC, datetime, timezone"))
    said = check(_python(MINORS[0]), head, tmp_path)
    failed = {f["where"]: f["error"] for f in said["failed"]}
    assert "gpugeek_jupyter.clouds.aws" in failed, said
    assert "cannot import name 'UTC' from 'datetime'" in failed["gpugeek_jupyter.clouds.aws"], failed


def test_an_ssh_or_slurm_heads_watchdog_imports_no_clouds_code(tmp_path):
    """A head whose order names no provider loads no provider's module, nor Ray's launcher's
    config, nor the cloud head's part of the watchdog (their names: ``clouds.PROVIDERS``)."""
    from gpugeek_jupyter.clouds import PROVIDERS

    head = unpacked(tmp_path / "head")
    unwanted = (*(f"gpugeek_jupyter.clouds.{name}" for name in PROVIDERS), "gpugeek_jupyter.backends.launcher",
                "gpugeek_jupyter.backends.clouds", "gpugeek_jupyter.guard.cloudhead")
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import gpugeek_jupyter.guard.headwatch; "
             f"print(sorted(m for m in sys.modules if m in {unwanted!r}))")
    done = subprocess.run([sys.executable, "-c", probe, str(head)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_vermin_refuses_what_is_newer_than_the_oldest_minor(tmp_path):
    """``make lint``'s rule (``vermin`` over the package), on the line that broke the 3.10 heads and
    on its fix."""
    vermin = Path(sys.executable).with_name("vermin")
    target = f"--target={MINORS[0]}-"
    bad = tmp_path / "bad.py"
    bad.write_text("from datetime import UTC\n")
    refused = subprocess.run([str(vermin), "--no-tips", "--violations", "-q", target, str(bad)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "datetime.UTC" in refused.stdout, refused.stdout
    fixed = tmp_path / "fixed.py"
    fixed.write_text("from datetime import datetime, timezone\n")
    passed = subprocess.run([str(vermin), "--no-tips", "--violations", "-q", target, str(fixed)],
                            capture_output=True, text=True, timeout=120)
    assert passed.returncode == 0, passed.stdout
