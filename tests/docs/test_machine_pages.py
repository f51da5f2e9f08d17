"""Every page of a way to get machines (``docs/machines/*.md``, but its index) tells the reader how
to stop what it starts (``down``, as code) and what it costs (cost, $, billed, price…).

Read from the sources, beside the built site's checks (``make docs`` runs this folder).
"""

from __future__ import annotations

import re
from pathlib import Path

MACHINES = Path(__file__).resolve().parents[2] / "docs" / "machines"

# `down`, `%gpugeek down`, `gpugeek down --all`, `down NAME --forget`: a code span naming the command
STOP = re.compile(r"`[^`\n]*\bdown\b[^`\n]*`")
COST = re.compile(r"\bcosts?\b|\$|\bbill(?:s|ed|ing)?\b|\bpric(?:e|ed|es|ing)\b|\bdollars?\b|\bfree\b", re.I)


def missing(text: str) -> list[str]:
    """What a machine page lacks: 'how to stop it', 'what it costs', both or neither."""
    return [what for what, pattern in (("how to stop it (`down`)", STOP), ("what it costs", COST))
            if not pattern.search(text)]


def test_the_check_sees_a_page_without_stop_or_cost():
    assert missing("# Machines: x\n\nA cluster of x. It shuts down by itself.") == [
        "how to stop it (`down`)", "what it costs"]
    assert missing("Stop it with `%gpugeek down`.") == ["what it costs"]
    assert missing("It costs $2/h.") == ["how to stop it (`down`)"]
    assert missing("`down NAME` stops it; it is billed by the second.") == []
    assert missing("`downtime`: priceless") == ["how to stop it (`down`)", "what it costs"]


def test_every_machine_page_says_how_to_stop_it_and_what_it_costs():
    pages = sorted(p for p in MACHINES.glob("*.md") if p.name != "index.md")
    assert pages, f"no machine pages in {MACHINES}"
    lacking = {p.name: gaps for p in pages if (gaps := missing(p.read_text()))}
    assert not lacking, f"machine pages that do not say how to stop them or what they cost: {lacking}"
