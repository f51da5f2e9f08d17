"""The user's pages, read from their sources beside the built site's checks (``make docs`` runs
this folder):

- every page of a way to get machines (``docs/machines/*.md``, but its index and the clouds' setup
  pages) has the same sections — what you need, how to start it, what you see, how to stop it
  (``down``, as code), what it costs (cost, $, billed, price…) and what can fail;
- no user page (all of ``docs/`` but the development pages) reads as a test report: how the
  package is tested and what was measured on the project's own machines belong to the development
  pages.
"""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
MACHINES = DOCS / "machines"
# the clouds' setup pages sit beside the machine pages; they set an account up, and start nothing
SETUP_PAGES = {"index.md", "aws.md", "gcp.md", "azure.md"}

# `down`, `%gpugeek down`, `gpugeek down --all`, `down NAME --forget`: a code span naming the command
STOP = re.compile(r"`[^`\n]*\bdown\b[^`\n]*`")
COST = re.compile(r"\bcosts?\b|\$|\bbill(?:s|ed|ing)?\b|\bpric(?:e|ed|es|ing)\b|\bdollars?\b|\bfree\b", re.I)

# each section a machine page has: a heading that names it
SECTIONS = (
    ("what you need", re.compile(r"^##\s+What you need\b", re.M | re.I)),
    ("start it", re.compile(r"^##\s+Start it\b", re.M | re.I)),
    ("what you see", re.compile(r"^##\s+What you see\b", re.M | re.I)),
    ("stop it", re.compile(r"^##\s+Stop it\b", re.M | re.I)),
    ("what it costs", re.compile(r"^##\s+What it costs\b", re.M | re.I)),
    ("what can fail", re.compile(r"^##\s+What can fail\b", re.M | re.I)),
)


def missing(text: str) -> list[str]:
    """What a machine page lacks: 'how to stop it', 'what it costs', both or neither."""
    return [what for what, pattern in (("how to stop it (`down`)", STOP), ("what it costs", COST))
            if not pattern.search(text)]


def missing_sections(text: str) -> list[str]:
    """The sections a machine page lacks, by name."""
    return [name for name, heading in SECTIONS if not heading.search(text)]


# what a test report says: how the package is tested, on what, and what was measured there
TEST_TALK = re.compile("|".join((
    r"\bhow (?:it|this) is tested\b",
    r"\btested (?:on|with|against|in|by)\b",
    r"\bmeasured on (?:the|a|an|two|\d)",
    r"\bthe lab's\b",
    r"\blab hosts?\b",
    r"\bin a box\b",
    r"\bmoto(?:'s)?\b",
    r"\bnetwork namespaces?\b",
    r"\bcounted by namespace\b",
    r"\bmake (?:test|cloudbox|stranger|lid|bench|[a-z]+-lab)\b",
    r"\btests/",
    r"\bthe suite\b",
    r"(?-i:\bCI\b)",
    r"\bpassed \d+ (?:runs|of)\b",
)), re.I)


def report_talk(text: str) -> list[str]:
    """Each phrase of a test report in ``text``."""
    return [m.group(0) for m in TEST_TALK.finditer(text)]


def user_pages() -> list[Path]:
    """Every page a user reads: all of docs/ but the development pages (and what the build makes:
    the executed notebooks' pages)."""
    return sorted(p for p in DOCS.rglob("*.md")
                  if p.relative_to(DOCS).parts[0] not in {"development", "development.md", "ARCHITECTURE.md",
                                                          "examples", "_ext", "_static"})


def machine_pages() -> list[Path]:
    return sorted(p for p in MACHINES.glob("*.md") if p.name not in SETUP_PAGES)


def test_the_check_sees_a_page_without_stop_or_cost():
    assert missing("# Machines: x\n\nA cluster of x. It shuts down by itself.") == [
        "how to stop it (`down`)", "what it costs"]
    assert missing("Stop it with `%gpugeek down`.") == ["what it costs"]
    assert missing("It costs $2/h.") == ["how to stop it (`down`)"]
    assert missing("`down NAME` stops it; it is billed by the second.") == []
    assert missing("`downtime`: priceless") == ["how to stop it (`down`)", "what it costs"]


def test_the_check_sees_a_page_without_its_sections():
    whole = ("# Machines: x\n\n## What you need\n\nx\n\n## Start it\n\n```\n%gpugeek up\n```\n\n"
             "## What you see\n\nlines\n\n## Stop it\n\n`%gpugeek down`\n\n## What it costs\n\n$0\n\n"
             "## What can fail\n\nthis\n")
    assert missing_sections(whole) == []
    assert missing_sections(whole.replace("## Stop it", "## Ending it")) == ["stop it"]
    assert missing_sections(whole.replace("## What can fail", "what can fail")) == ["what can fail"]
    assert missing_sections("# Machines: x\n\nIt costs $2/h; `down` stops it.") == [name for name, _ in SECTIONS]


def test_every_machine_page_says_how_to_stop_it_and_what_it_costs():
    pages = machine_pages()
    assert pages, f"no machine pages in {MACHINES}"
    lacking = {p.name: gaps for p in pages if (gaps := missing(p.read_text()))}
    assert not lacking, f"machine pages that do not say how to stop them or what they cost: {lacking}"


def test_every_machine_page_has_every_section():
    pages = machine_pages()
    assert {p.name for p in pages} >= {"local.md", "sim.md", "ssh.md", "marketplace.md", "cloud.md", "kuberay.md",
                                       "slurm.md"}
    lacking = {p.name: gaps for p in pages if (gaps := missing_sections(p.read_text()))}
    assert not lacking, f"machine pages without these sections: {lacking}"


def test_the_check_sees_test_report_talk():
    for report in ("## How it is tested\n\nIt runs on a real Slurm.",
                   "Measured on the 2-core machine: `up` 79 s.",
                   "a host killed on the lab's hosts", "on three lab hosts that share nothing",
                   "AWS has run end to end against EC2 in a box", "moto's EC2 answers",
                   "Debian's Slurm in network namespaces", "nothing left, counted by namespace",
                   "`make test` runs it", "`make slurm-lab` (thirteen minutes)", "see `tests/lab/test_onprem.py`",
                   "which CI runs after the suite", "its module passed 5 runs of 5 beside a busy loop",
                   "Tested on a local 2-worker cluster"):
        assert report_talk(report), report
    for plain in ("`make lab` opens JupyterLab", "a namespace that persists between cells",
                  "activations are measured on tiny batches of the model", "a link named with its measured rate",
                  "the cell's tests pass", "a lab server of yours", "Slurm's `--test-only`"):
        assert not report_talk(plain), plain


def test_no_user_page_reads_as_a_test_report():
    pages = user_pages()
    assert DOCS / "machines" / "slurm.md" in pages and DOCS / "how-to" / "run.md" in pages
    assert not any(p.relative_to(DOCS).parts[0].startswith("development") for p in pages)
    found = {str(p.relative_to(DOCS)): said for p in pages if (said := report_talk(p.read_text()))}
    assert not found, f"user pages that talk like test reports (move it to the development pages): {found}"
