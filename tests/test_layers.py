"""The package's import graph, read from the source: arrows point down the layers, never in a
circle, and nothing below the notebook layer imports ``widgets/`` or ``magics``.

Every import statement counts, also one inside a function (it runs the first time the function
does). Only ``if TYPE_CHECKING:`` blocks are left out: they never run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpugeek_jupyter"
ROOT = "gpugeek_jupyter"

# Lowest first. A module may import modules of its own unit (without a cycle) or of a unit in a
# lower rank, never one in its own rank or above. docs/ARCHITECTURE.md draws the same picture.
LAYERS: list[set[str]] = [
    {"errors", "display"},
    {"units", "config", "vocab"},
    {"store", "raynodes", "blocks"},
    {"catalog"},
    {"meter", "views"},
    {"sizing"},
    {"cluster"},
    {"workers"},
    {"health"},
    {"api", "server", "cli"},
    {"widgets"},
    {"magics"},
    {""},                       # the package root: where the notebook layer plugs itself in
]
NOTEBOOK_LAYER = {"widgets", "magics"}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node, except what sits under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports (a package's ``X`` means ``pkg.X`` when that
    is a module of its own)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == ROOT)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != ROOT:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def unit(module: str) -> str:
    """``gpugeek_jupyter.cluster.up`` → ``cluster``; the root package → ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def rank(module: str) -> int:
    for i, layer in enumerate(LAYERS):
        if unit(module) in layer:
            return i
    raise AssertionError(f"{module} belongs to no layer: add its unit to LAYERS (and to docs/ARCHITECTURE.md)")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_nothing_below_the_notebook_layer_imports_widgets_or_magics():
    wrong = [f"{m} imports {t}" for m, targets in sorted(graph().items()) for t in sorted(targets)
             if unit(m) not in NOTEBOOK_LAYER | {""} and unit(t) in NOTEBOOK_LAYER]
    assert not wrong, "the core reaches up into the notebook layer:\n" + "\n".join(wrong)


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" ↔ ".join(c) for c in found)


def test_imports_point_down_the_layers():
    wrong = [f"{m} (layer {rank(m)}) imports {t} (layer {rank(t)})"
             for m, targets in sorted(graph().items()) for t in sorted(targets)
             if unit(m) != unit(t) and rank(t) >= rank(m)]
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def test_no_private_name_is_imported_across_modules():
    """``from .x import _name`` couples two modules through what one of them calls private."""
    wrong = []
    for name, path in sorted(modules().items()):
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(ROOT)):
                wrong += [f"{name}: from {'.' * node.level}{node.module or ''} import {a.name}"
                          for a in node.names if a.name.startswith("_") and a.name != "__version__"]
    assert not wrong, "\n".join(wrong)


def reachable(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(edges.get(module, ()))
    return seen


@pytest.mark.parametrize("entry", [f"{ROOT}.cluster.watchdog", f"{ROOT}.server.handlers", f"{ROOT}.cluster.board"])
def test_the_server_and_the_watchdog_never_reach_a_kernels_connection(entry):
    """They stop clusters too, but a kernel's Ray connection and session are not theirs to touch."""
    kernel_only = {f"{ROOT}.cluster.connection", f"{ROOT}.cluster.session", f"{ROOT}.api"}
    assert not reachable(entry, graph()) & kernel_only


def test_the_walk_sees_imports_inside_functions_and_skips_type_checking(tmp_path):
    """The walker itself: an import in a function counts, one under TYPE_CHECKING does not."""
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .widgets import x\n"
                      "def f():\n    from .magics import y\n")
    found = imports_of(f"{ROOT}.probe", source, {f"{ROOT}.magics", f"{ROOT}.widgets"})
    assert found == {f"{ROOT}.magics"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# what each process of the system may load; measured in a fresh interpreter each
HEAVY = ("pandas", "plotly", "ipywidgets", "IPython", "torch")
LIGHT_ENTRIES = {
    # a Ray worker unpickles the worker actor: torch yes, but no tables, charts or widgets
    "a Ray worker": (f"import {ROOT}.workers.worker", {"torch"}),
    # the watchdog meters and stops; it draws nothing
    "the watchdog": (f"import {ROOT}.cluster.watchdog", set()),
    # the Jupyter server answers the status bar every few seconds from every open tab
    "the Jupyter server": (f"import {ROOT}.server.handlers; from {ROOT}.cluster import board;"
                           f" board.overview()", set()),
    # the terminal command starts at once, with no Jupyter, kernel or Ray
    "the gpugeek command": (f"import contextlib, io\nfrom {ROOT}.cli import main\n"
                            "with contextlib.redirect_stdout(io.StringIO()): main(['clusters'])", set()),
    # the package root is lazy: importing it loads none of its layers
    "import gpugeek_jupyter": (f"import {ROOT}", set()),
}


@pytest.mark.parametrize("who", sorted(LIGHT_ENTRIES))
def test_each_process_loads_only_what_it_uses(who, gpugeek_home):
    code, allowed = LIGHT_ENTRIES[who]
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert loaded <= allowed, f"{who} loads {sorted(loaded - allowed)}"


MAX_MODULE_LINES = 420   # "about 400": a module holds one idea


def test_no_module_is_much_over_400_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these along their seams: {long}"
