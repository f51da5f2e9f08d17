"""The troubleshooting page's messages, read from the code's raise sites.

Every ``raise GpugeekError(...)`` (and its kinds, and IPython's ``UsageError`` in the magics)
renders as one line in a notebook. This reads each message as written — its f-string holes shown
as ``‹…›`` — and groups them by the step of the loop its module serves, so the page lists the
messages a user can meet, no more, no other words.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from reference import _Generated

PACKAGE = Path(__file__).resolve().parents[2] / "gpugeek_jupyter"
RAISED = {"GpugeekError", "UsageError", "NoMatchingOffers", "LaunchRefused"}
# the step of the loop a unit serves (its first path part), in the order of the loop
STEPS = (
    ("Price", ("catalog",)),
    ("Plan", ("sizing",)),
    ("Provision", ("provision", "backends", "remote", "clouds", "cluster", "launch", "raynodes.py")),
    ("Run", ("cells", "group", "workers", "kernel", "line", "keeper", "onhost")),
    ("Meter, budgets and autostop", ("meter", "guard", "health", "store.py")),
    ("View", ("widgets", "views", "display.py", "server")),
    ("The magics, the command and the settings", ("magics", "cli.py", "api.py", "config.py", "units.py",
                                                  "vocab.py", "blocks.py", "versions.py", "ports.py", "lean.py")),
)


def _text(node: ast.expr) -> str | None:
    """A message expression as written: literal text, holes as ‹source›; None when not text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:       # a value's name where it has a short one; else only that a value goes there
                source = ast.unparse(value.value)
                simple = isinstance(value.value, ast.Name | ast.Attribute | ast.Subscript) and len(source) <= 24
                parts.append(f"‹{source if simple else '…'}›")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None and right is None else (left or "‹…›") + (right or "‹…›")
    if isinstance(node, ast.Name):
        return f"‹{node.id}›"
    return None


def messages(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name in RAISED and node.exc.args:
                text = _text(node.exc.args[0])
                if text and len(re.sub("‹[^›]*›", "", text).strip(" :.—")) >= 12:
                    found.append(" ".join(text.split()))
    return found


def step_of(path: Path) -> str:
    first = path.relative_to(PACKAGE).parts[0]
    return next((title for title, units in STEPS if first in units), STEPS[-1][0])


def by_step() -> dict[str, list[tuple[str, str]]]:
    """Step → (message, module), each message once."""
    grouped: dict[str, list[tuple[str, str]]] = {title: [] for title, _ in STEPS}
    seen = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(PACKAGE.parent))
        for text in messages(path):
            if text not in seen:
                seen.add(text)
                grouped[step_of(path)].append((text, module))
    return grouped


class ErrorsDirective(_Generated):
    def lines(self) -> list[str]:
        out: list[str] = []
        for title, found in by_step().items():
            if not found:
                continue
            out += [title, "-" * (len(title) + 4), ""]
            for text, module in found:
                head, sep, todo = text.partition(" — ")
                out += [f"* ``{_literal(head)}``" + (f" — **{_plain(todo)}**" if sep else ""),
                        f"  (``{module}``)"]
            out.append("")
        return out


def _literal(text: str) -> str:
    return text.replace("`", "'")


def _plain(text: str) -> str:
    return text.replace("\\", "\\\\").replace("*", r"\*").replace("`", "'").replace("_", r"\_").replace("|", r"\|")


def setup(app):
    from docutils.parsers.rst import directives

    directives.register_directive("gpugeek-errors", ErrorsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
