"""Every call a cell makes on ``gg`` has its entry in the reference (``reference/in-cell``), made
from its docstring: a method added to the workers' helper without one, or left off the declared
list (``workers.helper.IN_CELL``) while a cell can call it, fails here.

Run by ``make docs`` after the build, against ``site/``.
"""

from __future__ import annotations

import html
import inspect
import re
from pathlib import Path

from gpugeek_jupyter.workers.helper import IN_CELL, Helper

PAGE = Path(__file__).resolve().parents[2] / "site" / "reference" / "in-cell.html"
# the helper's public methods that are not a cell's: the worker's and the frameworks' reporters'
NOT_A_CELLS = {"configure": "the worker sets each cell's flags", "begin": "a framework's loop starts (launch/)",
               "seen": "a framework's step (launch/)", "flush": "the worker sends the cell's last report"}


def test_each_public_call_of_the_helper_is_in_cell_or_named_as_not_a_cells():
    public = {name for name, _ in inspect.getmembers(Helper) if not name.startswith("_")}
    assert public - set(IN_CELL) == set(NOT_A_CELLS), (
        f"in neither IN_CELL nor NOT_A_CELLS: {sorted(public - set(IN_CELL) - set(NOT_A_CELLS))}")
    assert not set(IN_CELL) - public, sorted(set(IN_CELL) - public)


def test_each_in_cell_call_has_a_docstring_and_an_entry_on_the_page():
    text = html.unescape(re.sub(r"<[^>]+>", "", PAGE.read_text()))
    for name in IN_CELL:
        member = inspect.getattr_static(Helper, name)
        doc = inspect.getdoc(member.fget if isinstance(member, property) else member)
        assert doc, f"gg.{name} has no docstring: its reference entry would be empty"
        assert f"gg.{name}" in text and doc.split("\n")[0].split("``")[0][:40] in text, f"gg.{name} is not on the page"
