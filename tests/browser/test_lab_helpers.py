"""The harness itself: a run stops at a raising cell, and error_outputs tells errors from stderr."""

from __future__ import annotations

import shutil

import nbformat
import pytest
from lab import _disk_really_full, error_outputs, put_notebook, run_notebook_in_lab

v4 = nbformat.v4


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_run_stops_at_error_and_errors_are_collected(lab, page):
    nb = v4.new_notebook(cells=[
        v4.new_markdown_cell("# not code"),
        v4.new_code_cell(""),
        v4.new_code_cell('import sys; print("out"); print("to stderr", file=sys.stderr)'),
        v4.new_code_cell("1/0"),
        v4.new_code_cell("print('never runs')"),
    ])
    path = put_notebook(lab, nb, "helpers/errors.ipynb")

    run = run_notebook_in_lab(page, lab.base_url, lab.token, path, timeout=90)

    assert run.prompts == ["[ ]:", "[1]:", "[2]:", "[ ]:"], run  # empty cell, ran, raised, skipped
    assert run.executed == 2
    errors = error_outputs(page)
    assert [(e["cell"], e["kind"]) for e in errors] == [(2, "stderr"), (3, "error")], errors
    assert "ZeroDivisionError" in errors[1]["text"]
    assert error_outputs(page, stderr=False) == [errors[1]]


def test_a_disk_warning_is_forgiven_only_when_the_disk_is_that_full(tmp_path):
    usage = shutil.disk_usage(tmp_path)
    used = round(100 * (1 - usage.free / usage.total))

    def said(percent: int, extra: str = "") -> dict:
        line = (f"(raylet) [2026-11-26 01:51:41,289 E 1 2] (raylet) file_system_monitor.cc:116: "
                f"{tmp_path}/session_x is over {percent}% full, available space: 1 GB; capacity: 2 GB.")
        return {"cell": 5, "kind": "stderr", "text": line + "\n" + extra}

    assert _disk_really_full(said(max(used - 1, 0)))          # as full as it says: the machine's state
    if used < 97:
        assert not _disk_really_full(said(used + 3))          # it is not: then it counts as an error
    assert not _disk_really_full(said(max(used - 1, 0), "Traceback (most recent call last):"))
    assert not _disk_really_full({"cell": 1, "kind": "stderr", "text": "to stderr"})
