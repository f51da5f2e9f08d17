"""A backend is one class that says what it can do (``backends/interface.py``); code outside
``backends/`` asks a cluster's backend what it can do (``capable(record).tunnelled``) and never
compares a backend's name. Read from the source: a new backend then needs no edit elsewhere."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

import gpugeek_jupyter as gg
from gpugeek_jupyter.backends.interface import BACKENDS, Backend, Feature, capabilities
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.errors import GpugeekError

PACKAGE = Path(__file__).resolve().parent.parent / "gpugeek_jupyter"
NAMES = set(BACKENDS) | {"attach"}


def _about_a_backend(node: ast.AST) -> bool:
    """``record.backend``, a variable named ``backend``, or ``order["backend"]``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "backend"
    if isinstance(node, ast.Name):
        return node.id == "backend"
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "backend"


def _strings(node: ast.AST) -> list[str] | None:
    """The strings a literal holds (a string, or a tuple, list or set of strings and ``None``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set) and node.elts and all(
            isinstance(e, ast.Constant) and (e.value is None or isinstance(e.value, str)) for e in node.elts):
        return [e.value for e in node.elts if e.value is not None]
    return None


def name_checks(source: str, where: str) -> list[str]:
    """A backend compared with backend names, and literal lists of two or more backend names (a
    list with other words in it, like the catalog's providers, is something else)."""
    found, seen = [], set()
    nodes = list(ast.walk(ast.parse(source)))
    for node in nodes:
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = [side for side in sides if set(_strings(side) or ()) & NAMES]
            if named and any(_about_a_backend(side) for side in sides):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
                seen.update(id(side) for side in named)
    for node in nodes:
        if isinstance(node, ast.Tuple | ast.List | ast.Set) and id(node) not in seen:
            names = _strings(node)
            if names and len(names) >= 2 and set(names) <= NAMES:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda line: int(line.split(":")[1]))


def test_code_outside_the_backends_asks_what_a_backend_can_do_never_its_name():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "backends" not in path.relative_to(PACKAGE).parts:
            found += name_checks(path.read_text(), str(path.relative_to(PACKAGE)))
    assert not found, ("ask the backend (backends.interface.capable(record).tunnelled, …), or give it a "
                       "capability that says so:\n" + "\n".join(found))


def test_the_rule_sees_a_name_check_and_lets_other_words_be():
    probe = ('ours_here = record.backend in ("local", "sim")\n'
             'if spec.backend == "ssh":\n    pass\n'
             'if backend not in (None, "local", "attach"):\n    pass\n'
             'BACKENDS = ("ssh", "aws", "gcp", "azure")\n'
             'stop = order["backend"] != "aws"\n'
             'gpus = "its GPUs" if backend == "nccl" else "none"\n'       # torch.distributed's backend
             'wanted = kind == "sim"\n'                                    # a widget's choice
             'PROVIDERS = ("aws", "gcp", "azure", "lambda")\n')            # the catalog's providers
    assert [line.split(":")[1] for line in name_checks(probe, "probe")] == ["1", "2", "4", "6", "7"]


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_backend_says_each_thing_it_can_do(name):
    """``Backend`` declares each capability without a value: a backend that leaves one unsaid
    fails here (and at its first use), not by inheriting a guess."""
    backend = BACKENDS[name]
    hints = typing.get_type_hints(Backend)
    assert capabilities() and set(capabilities()) <= set(hints)
    for capability in capabilities():
        assert hasattr(backend, capability), f"the {name} backend does not say whether it is {capability}"
        value = getattr(backend, capability)
        assert isinstance(value, hints[capability]), f"{name}.{capability} = {value!r}"
    assert backend.kernel_joins in ("driver", "line", None)
    if backend.kernel_joins == "client":      # a kernel's Ray Client goes through the tunnel's port
        assert backend.tunnelled
    # each feature it lacks is said with why (``Backend.cannot``), exactly where its capabilities say so
    assert (Feature.LIMITS in backend.cannot) == (not backend.watched), "say why --budget and --idle cannot hold"
    assert (Feature.DASHBOARD in backend.cannot) == (not backend.dashboard)
    assert (Feature.PREEMPT in backend.cannot) == (not backend.simulated)
    assert (Feature.SCALE in backend.cannot) == (type(backend).scale is Backend.scale)
    for feature, why in backend.cannot.items():
        assert why and "\n" not in why and not why.endswith("."), f"{name} {feature.value}: {why!r}"


def test_a_feature_a_backend_lacks_is_refused_in_one_line_with_its_reason(gpugeek_home):
    """Asked through ``up`` and the backend itself, before anything is recorded or started."""
    with pytest.raises(GpugeekError) as limits:
        gg.up("k8s", backend="kuberay", gpu="A100", budget=5.0, dry_run=True)
    assert str(limits.value).startswith("--budget and --idle: not enforced on KubeRay yet"), limits.value
    with pytest.raises(GpugeekError) as dashboard:
        gg.up("web", backend="ssh", hosts="root@127.0.0.1", usd_per_hour=1.0, dashboard=True, dry_run=True)
    assert str(dashboard.value) == f"--dashboard: {BACKENDS['ssh'].cannot[Feature.DASHBOARD]}"
    with pytest.raises(GpugeekError, match=r"^scale: the local backend is this one machine — `up --backend sim`"):
        BACKENDS["local"].scale(None, None, 2)
    with pytest.raises(GpugeekError, match=r"^preempt: a cloud preempts its spot nodes for real; `preempt` "
                                           r"rehearses losing a spot node, on a sim cluster only"):
        BACKENDS["aws"].node(None, "abc")
    assert registry.all_records() == []


def _named_literals(path: Path, names: set[str]) -> list[str]:
    return [f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_a_cloud_providers_name_is_in_its_own_module_alone():
    """Each cloud (``clouds/<name>.py``) says its YAML, credentials, notices, self-stop and spot
    label; the launcher, KubeRay, the workers and the head's watchdog ask the object. The catalog's
    reader of SkyPilot's files is the one other place: there a provider is data (a folder name)."""
    from gpugeek_jupyter.clouds import CLOUDS

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if parts[0] == "catalog" or (parts[0] == "clouds" and path.stem in CLOUDS):
            continue
        found += _named_literals(path, set(CLOUDS))
    assert not found, "a cloud's name outside its module (ask clouds.CLOUDS[...]):\n" + "\n".join(found)



def test_code_outside_the_backends_reaches_them_through_the_registry_alone():
    """A backend's own module (``sim.py``, ``hosts.py``, …) is imported by the registry alone:
    anything else asks ``backends.interface`` (a rehearsal's preemption is ``capable(record)
    .preempt``), so adding a backend touches no module outside ``backends/``."""
    own = {f"backends.{p.stem}" for p in (PACKAGE / "backends").glob("*.py")} - {
        "backends.__init__", "backends.interface", "backends.base", "backends.launcher", "backends.rented",
        "backends.readiness"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "backends":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                target = node.module.lstrip(".").removeprefix("gpugeek_jupyter.")
                reached = {target} | {f"{target}.{a.name}" for a in node.names}
                found += [f"{rel}:{node.lineno}: {m}" for m in sorted(reached & own)]
    assert not found, "a backend's module imported outside backends/ (ask backends.interface):\n" + "\n".join(found)


def test_the_backends_table_says_for_each_feature_yes_or_why_not():
    """``%gpugeek backends``: what ``up`` and the other commands would answer, before asking them."""
    table = gg.backend_features()
    assert list(table.index) == list(BACKENDS) and list(table.columns) == [f.value for f in Feature]
    for name, impl in BACKENDS.items():
        for feature in Feature:
            assert table.loc[name, feature.value] == impl.cannot.get(feature, "yes")
    assert table.loc["sim", "preempt"] == "yes" and table.loc["local", "scale"].startswith("the local backend is")
