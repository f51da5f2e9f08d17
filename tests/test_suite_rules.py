"""Rules for the suites themselves, read from their source: a test waits on the condition it
means, not on the clock — every ``time.sleep`` in the tests sits in a loop that polls for
something, or says on its own line why that stretch of time is the point."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def bare_sleeps(path: Path) -> list[str]:
    """``time.sleep`` calls outside any loop of their function and without a comment on their line."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "time.sleep"):
            continue
        up, polled = node, False
        while up in parents and not isinstance(up, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            up = parents[up]
            polled = polled or isinstance(up, ast.While | ast.For)
        if not polled and "#" not in lines[node.lineno - 1]:
            found.append(f"{path.name}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_every_sleep_in_the_tests_polls_a_condition_or_says_why():
    bare = [line for path in sorted(TESTS.rglob("*.py")) for line in bare_sleeps(path)]
    assert not bare, "wait on the condition (cluster_processes.wait_until), or say why on the line:\n" + "\n".join(bare)


def test_the_rule_sees_a_bare_sleep(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import time\ndef a():\n    time.sleep(1)\ndef b():\n    while True:\n        time.sleep(1)\n"
                     "def c():\n    time.sleep(1)   # the cut lasts a second\n")
    assert [line.split(":")[1] for line in bare_sleeps(probe)] == ["3"]
