"""The package's import graph, read from the source: arrows point down the layers, never in a
circle, and nothing below the notebook layer imports ``widgets/`` or ``magics``.

Every import statement counts: one inside a function (it runs the first time the function does)
and one under ``if TYPE_CHECKING:`` (it never runs, but it is still an arrow in the design).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpugeek_jupyter"
ROOT = "gpugeek_jupyter"

# Lowest first. A module may import modules of its own unit (without a cycle) or of a unit in a
# lower rank, never one in its own rank or above. docs/ARCHITECTURE.md draws the same picture.
LAYERS: list[set[str]] = [
    {"errors", "display", "onhost", "lean", "ports"},   # … | what runs on a bare host: the standard library alone
    {"units", "config", "vocab", "line"},   # … | the line between a kernel and a keeper
    {"store", "raynodes", "blocks", "versions"},
    {"catalog", "launch", "clouds"},   # offers | how a worker becomes a rank | each cloud provider
    {"meter", "views", "workers"},   # the ledger, telemetry | records → figures | what runs in the Ray workers
    {"sizing"},
    {"cluster"},                # the state every process shares: spec, registry, processes
    {"remote"},                 # this machine reaching hosts: ssh, tunnel, head guard
    {"backends", "group"},      # how machines appear and disappear | the warm group, from a Ray driver
    {"guard", "kernel"},        # the watchdog, server and terminal | a kernel's own state
    {"provision"},              # what a kernel asks for
    {"cells"},                  # %%gpugeek run from the kernel: the warm group, a cell as a job
    {"health"},
    {"api", "server", "cli", "keeper"},
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
    """Every node: an import under ``if TYPE_CHECKING:`` is an arrow too."""
    return ast.walk(tree)


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


def by_name() -> dict[str, set[str]]:
    """What the two registries import by name, when first asked (``import_module``): the clouds'
    (``clouds.CLOUDS``, each provider's module) and the backends' (``backends.interface.BACKENDS``)."""
    from gpugeek_jupyter.backends import interface
    from gpugeek_jupyter.clouds import PROVIDERS

    return {f"{ROOT}.clouds": {f"{ROOT}.clouds.{name}" for name in PROVIDERS},
            f"{ROOT}.backends.interface": {f"{ROOT}.backends.{module}" for module, _ in interface._WHERE.values()}}


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges = {name: imports_of(name, path, set(mods)) for name, path in mods.items()}
    for name, loaded in by_name().items():
        edges[name] |= loaded
    return edges


def unit(module: str) -> str:
    """``gpugeek_jupyter.provision.up`` → ``cluster``; the root package → ``""``."""
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


def _units_imported_by(importer: str) -> set[str]:
    return {unit(t) for m, targets in graph().items() if unit(m) == importer for t in targets} - {importer}


def test_workers_import_launch_clouds_and_the_ground_floor_only():
    """docs/ARCHITECTURE.md: ``workers/`` imports ``launch/``, ``clouds/`` (a spot notice's
    reader) and the rows below them, nothing else (a worker loads nothing of the kernel's)."""
    ground = set().union(*LAYERS[:3])
    assert _units_imported_by("workers") <= ground | {"launch", "clouds"}, _units_imported_by("workers")


def test_kernel_is_loaded_by_a_kernels_rooms_alone():
    """docs/ARCHITECTURE.md: ``kernel/`` is imported by what a kernel runs, never by the keeper on
    a remote head (which drives its warm groups through ``group/``), the server, the watchdogs or
    the workers."""
    importers = {unit(m) for m, targets in graph().items() for t in targets
                 if unit(t) == "kernel" and unit(m) != "kernel"}
    assert importers == {"api", "cells", "health", "provision"}, importers


def test_the_keeper_reaches_nothing_of_the_kernels_rooms():
    """docs/ARCHITECTURE.md: the head runs the head's code. No module of ``keeper/`` reaches
    ``kernel/`` or ``cells/`` by any chain of imports (in a function too), and a fresh interpreter
    that imports the keeper's modules loads none of theirs."""
    edges = graph()
    reached = {m: sorted(r for r in reachable(m, edges) if unit(r) in ("kernel", "cells"))
               for m in sorted(edges) if unit(m) == "keeper"}
    reached = {m: r for m, r in reached.items() if r}
    assert not reached, "the keeper reaches a kernel's rooms:\n" + "\n".join(f"{m} → {r}" for m, r in reached.items())
    probe = (f"import sys, {ROOT}.keeper.serve, {ROOT}.keeper.desk, {ROOT}.keeper.rank0, {ROOT}.keeper.shipped\n"
             f"print(' '.join(m for m in sys.modules if m.startswith(('{ROOT}.kernel', '{ROOT}.cells'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"a keeper loads {done.stdout.split()}"


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


@pytest.mark.parametrize("entry", [f"{ROOT}.guard.watchdog", f"{ROOT}.server.handlers", f"{ROOT}.guard.board",
                                   f"{ROOT}.guard.headwatch", f"{ROOT}.cli"])
def test_the_server_and_the_watchdogs_never_reach_a_kernels_connection(entry):
    """They stop clusters too, but a kernel's Ray connection and session are not theirs to touch."""
    reached = reachable(entry, graph())
    assert not {m for m in reached if unit(m) in ("kernel", "provision", "api")}, sorted(reached)


def test_the_walk_sees_imports_inside_functions_and_under_type_checking(tmp_path):
    """The walker itself: an import in a function counts, and so does one under TYPE_CHECKING."""
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .widgets import x\n"
                      "def f():\n    from .magics import y\n")
    found = imports_of(f"{ROOT}.probe", source, {f"{ROOT}.magics", f"{ROOT}.widgets"})
    assert found == {f"{ROOT}.magics", f"{ROOT}.widgets"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# what each process of the system may load; measured in a fresh interpreter each
HEAVY = ("pandas", "plotly", "ipywidgets", "IPython", "torch")
LIGHT_ENTRIES = {
    # a Ray worker unpickles the worker actor: torch yes, but no tables, charts or widgets
    "a Ray worker": (f"import {ROOT}.workers.worker", {"torch"}),
    # the watchdog meters and stops; it draws nothing
    "the watchdog": (f"import {ROOT}.guard.watchdog", set()),
    # a remote head's watchdog runs from the part of the package shipped to the head
    "the head's watchdog": (f"import {ROOT}.guard.headwatch", set()),
    # a remote head's keeper holds groups (their actor class loads torch) and draws nothing
    "a keeper": (f"import {ROOT}.keeper.serve, {ROOT}.keeper.desk", {"torch"}),
    # the Jupyter server answers the status bar every few seconds from every open tab
    "the Jupyter server": (f"import {ROOT}.server.handlers; from {ROOT}.guard import board;"
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


def test_a_ray_worker_loads_no_kernel_state_registry_or_sqlite(gpugeek_home):
    """A worker imports its actor and answers which versions of a cell's modules it has
    (``versions.version_of``): neither needs the kernel's session, the registry or SQLite."""
    probe = (f"import {ROOT}.workers.worker\nfrom {ROOT}.versions import version_of\nversion_of('json')\n"
             "import sys\nprint(' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    wrong = {m for m in loaded if m.startswith((f"{ROOT}.kernel", f"{ROOT}.cluster.registry", f"{ROOT}.store"))
             or m in ("sqlite3", "_sqlite3")}
    assert not wrong, f"a Ray worker loads {sorted(wrong)}"


# -- the rooms: where each folder's code runs, and what it may import ---------------------------

GROUND = {unit for layer in LAYERS[:3] for unit in layer}       # "the ground floor" in docstrings


def folders() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))


def room_lines(folder: Path) -> tuple[str, str]:
    """The two lines a folder's ``__init__`` docstring ends with: ``Runs on:`` and ``May import:``."""
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    runs, _, may = doc.partition("\nMay import:")
    runs = runs.rpartition("Runs on:")[2] if "Runs on:" in runs else ""
    return " ".join(runs.split()), " ".join(may.split())


# what a Ray worker of a group may load of ours: the worker side, how a worker becomes a rank, and
# the ground floor, and where each cloud's preemption notice is read (``clouds/``); never the kernel
# side (``cells/``), nor any kernel state under it
WORKER_SIDE = {"workers", "launch", "clouds"} | GROUND


def outside_the_worker_side(modules: set[str]) -> list[str]:
    """Our modules among ``modules`` that a worker may not load (the package root loads as every
    module's parent, and is lazy: ``import gpugeek_jupyter`` loads none of its layers)."""
    return sorted(m for m in modules if m.startswith(f"{ROOT}.") and unit(m) not in WORKER_SIDE)


def test_the_worker_side_imports_nothing_of_the_kernel_side():
    """``workers/`` holds what runs inside the Ray workers; ``cells/`` what only a kernel runs. No
    module of the first reaches one of the second (nor ``kernel/``, ``provision/``, …) by any
    chain of imports, in a function or not: a worker would load the kernel's state with it."""
    edges = graph()
    wrong = {m: outside_the_worker_side(reachable(m, edges)) for m in sorted(edges) if unit(m) == "workers"}
    wrong = {m: reached for m, reached in wrong.items() if reached}
    assert not wrong, "the worker side reaches beyond itself:\n" + "\n".join(f"{m} → {r}" for m, r in wrong.items())


def test_a_ray_workers_first_import_loads_only_the_worker_side(gpugeek_home):
    """Ray unpickles the ``Worker`` actor by its module path, so a worker's first import of ours is
    ``workers.worker``; what it loads, read with ``-X importtime`` in a fresh interpreter, is the
    worker side, ``launch/`` and the ground floor — no module of ``cells/``."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {ROOT}.workers.worker"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = {line.rpartition("|")[2].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert f"{ROOT}.workers.worker" in loaded, "-X importtime said nothing of the worker's module"
    wrong = outside_the_worker_side(loaded)
    assert not wrong, f"a Ray worker's first import loads the kernel side: {wrong}"


@pytest.mark.parametrize("folder", folders(), ids=lambda p: p.name)
def test_each_folder_says_where_it_runs_and_imports_only_what_it_says(folder):
    runs, may = room_lines(folder)
    assert runs and may, f"{folder.name}/__init__.py: its docstring must end with 'Runs on:' and 'May import:' lines"
    allowed = set(re.findall(r"`(\w+)/`", may)) | set(re.findall(r"`(\w+)\.py`", may))
    allowed |= GROUND if "the ground floor" in may else set()
    never = set(re.findall(r"never `(\w+)/`", may))
    used = {unit(t) for m, targets in graph().items() if unit(m) == folder.name for t in targets} - {folder.name}
    wrong = sorted(used - (allowed - never))
    assert not wrong, f"{folder.name}/ imports {wrong}, which its 'May import:' line leaves out"


ONHOST_MODULES = sorted((PACKAGE / "onhost").rglob("*.py"))


@pytest.mark.parametrize("path", ONHOST_MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_everything_that_ships_to_a_bare_host_needs_only_the_standard_library(path):
    """Every module in ``onhost/`` (a new one too) runs with whatever Python a host has, before
    anything of ours is installed there: ``script.py`` and ``runtime.py`` are sent over SSH or
    copied by the cluster launcher. What runs on a head with the package is not here
    (``guard/headwatch.py``)."""
    tree = ast.parse(path.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
              and not n.level}
    # the host script's parts travel as one text (``ssh.host_script``): a part may name an earlier one
    from gpugeek_jupyter.remote.ssh import HOST_SCRIPT

    earlier = {p.stem for p in HOST_SCRIPT[:HOST_SCRIPT.index(path)]} if path in HOST_SCRIPT else set()
    relative = [f"from {'.' * n.level}{n.module or ''} import …" for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.level and not (n.level == 1 and n.module in earlier)]
    assert not relative, f"imports of the package: {relative}"
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, sorted(names - set(sys.stdlib_module_names))


MAX_FOLDER_SHARE = 0.20     # no room holds more than a fifth of the house


def test_no_folder_holds_more_than_a_fifth_of_the_package():
    lines = {path: len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")
             if "labextension" not in path.parts}
    total = sum(lines.values())
    shares = {folder.name: sum(n for p, n in lines.items() if folder in p.parents) / total for folder in folders()}
    big = {name: f"{share:.0%}" for name, share in shares.items() if share > MAX_FOLDER_SHARE}
    assert not big, f"split these rooms: {big}"


def architecture_rows() -> dict[int, set[str]]:
    """docs/ARCHITECTURE.md's picture of the layers: its rank number → the units on that row."""
    text = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text()
    picture = text.split("## Layers", 1)[1].split("```", 2)[1]
    rows = {}
    for line in picture.splitlines():
        match = re.match(r"\s*(\d+)  (.*?)(?:\s{3,}|$)", line)     # units 2 spaces apart, then 3+
        if match:
            names = re.findall(r"(\w+)(?:/|\.py)", match.group(2))
            rows[int(match.group(1))] = {"" if n in (ROOT, "__init__") else n for n in names}
    return rows


def test_the_architecture_picture_is_the_layer_tests_own():
    """The docs' table of rooms and this test's LAYERS cannot drift apart."""
    rows = architecture_rows()
    assert rows == dict(enumerate(LAYERS)), (
        "docs/ARCHITECTURE.md's layer picture differs from LAYERS: "
        + "; ".join(f"{i}: docs {sorted(rows.get(i, set()))} vs test {sorted(layer)}"
                    for i, layer in enumerate(LAYERS) if rows.get(i) != layer))


LONG_FUNCTION_LINES = 60
STORY_ROOMS = ("provision", "kernel", "guard", "backends", "remote", "onhost", "cluster", "workers", "cells")


def test_no_function_in_the_cluster_rooms_or_workers_is_over_60_lines_without_saying_why():
    """A long function there says why in its docstring (``Long because …``)."""
    long = []
    for room in STORY_ROOMS:
        for path in sorted((PACKAGE / room).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    why = " ".join((ast.get_docstring(node) or "").split())
                    if lines > LONG_FUNCTION_LINES and "Long because" not in why:
                        long.append(f"{room}/{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these, or say why in the docstring ('Long because …'): " + ", ".join(long)


# -- a remote cell's path through the rooms ------------------------------------------------------

# A cell on a remote (ssh, onprem, cloud) cluster, from the magic to the worker that runs it: each
# hop (caller, callee, the name the caller uses, how). "calls": the caller imports the callee and
# names it; "serves": the callee imports the caller and hands it its handler (the line's server,
# rank 0's lead door). `pytest tests/test_layers.py -k remote_cell -s` prints it.
REMOTE_CELL = [
    ("magics", "api", "run", "calls"),
    ("api", "cells.jobs", "run", "calls"),
    ("cells.jobs", "cells.linegroup", "LineGroup", "calls"),
    ("cells.linegroup", "line.messages", "RunCell", "calls"),
    ("cells.linegroup", "line.wire", "call", "calls"),          # the kernel's Line, through the tunnel
    ("line.wire", "keeper.serve", "Server", "serves"),          # on the head: the keeper's server
    ("keeper.serve", "keeper.desk", "handle", "calls"),
    ("keeper.desk", "group.workergroup", "WorkerGroup", "calls"),
    ("keeper.desk", "keeper.rank0", "lead", "calls"),
    ("keeper.rank0", "workers.lead", "LeadCell", "calls"),
    ("workers.lead", "workers.worker", "LeadDoor", "serves"),   # rank 0's door hands it to execute_all
    ("workers.worker", "workers.cell", "Cell", "calls"),
]
KERNELS_ROOMS = {"cells", "kernel", "provision", "api", "magics", "widgets"}


def _row(module: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit(f"{ROOT}.{module}") in layer)


def test_a_remote_cells_path_is_read_from_the_code_and_the_head_side_runs_none_of_a_kernels_rooms():
    """Each hop of ``REMOTE_CELL`` is in the code (the import, and the name used); the path goes
    up a layer once, where the line's server hands the request to the keeper; and once past the
    line nothing on the head is of a kernel's rooms."""
    edges = graph()
    for caller, callee, name, how in REMOTE_CELL:
        importer, imported = (caller, callee) if how == "calls" else (callee, caller)
        assert f"{ROOT}.{imported}" in edges[f"{ROOT}.{importer}"], f"{importer} does not import {imported}"
        source = modules()[f"{ROOT}.{importer}"].read_text()
        assert re.search(rf"\b{name}\b", source), f"{importer} never names {name}"
    ups = [(caller, callee) for caller, callee, _, _ in REMOTE_CELL if _row(callee) > _row(caller)]
    wire = next(i for i, hop in enumerate(REMOTE_CELL) if hop[3] == "serves")
    head = {unit(f"{ROOT}.{m}") for hop in REMOTE_CELL[wire:] for m in hop[:2]} - {"line"}
    print("\n".join(f"{caller:>18} (row {_row(caller):>2}) → {callee:<18} (row {_row(callee):>2})  {how} {name}"
                    for caller, callee, name, how in REMOTE_CELL))
    print(f"folders on the head: {sorted(head)}; hops up a layer: {ups}")
    assert ups == [("line.wire", "keeper.serve")], ups
    assert not head & KERNELS_ROOMS, head & KERNELS_ROOMS
