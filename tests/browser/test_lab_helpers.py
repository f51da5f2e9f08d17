"""The harness itself: a run stops at a raising cell, and error_outputs tells errors from stderr."""

from __future__ import annotations

import nbformat
import pytest
from lab import error_outputs, put_notebook, run_notebook_in_lab

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
