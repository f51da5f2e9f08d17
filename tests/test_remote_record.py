"""A cluster's record of its machines (``cluster/remote.py``): typed, frozen, changed by ``learn``
alone — held here by reading the package's code, by trying to change one, and by loading a record
as the version before wrote it."""

from __future__ import annotations

import ast
import dataclasses
import json
import types
import typing
from pathlib import Path

import pytest

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster import remote as remote_record
from gpugeek_jupyter.cluster.remote import FACTS, Found, LaidOut, LineOpened, Remote, learn
from gpugeek_jupyter.cluster.spec import ClusterSpec

PACKAGE = Path(remote_record.__file__).resolve().parent.parent
WRITER = Path(remote_record.__file__).resolve()
MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "append", "extend", "insert", "remove", "add",
            "discard", "sort", "reverse", "__setitem__", "__setattr__", "__delitem__"}

# An ssh cluster's spec as the version before wrote it (a dict in the registry's JSON), on the lab's
# three hosts: its remote has no known_hosts, guard_pid or extra, and a key no version reads.
BEFORE = {
    "backend": "ssh", "pricing": "rate", "spot_fallback": False, "notes": [], "dashboard": False,
    "dashboard_url": None, "env": [], "working_dir": None, "storage": None,
    "head_price": {"offer_id": "", "pricing": "rate", "usd_per_hour": 7.2, "on_demand_usd_per_hour": None},
    "node_types": [{"name": "host", "offer_id": "", "provider": "ssh", "instance_type": "your machine", "region": "",
                    "zone": "", "gpu": "", "gpu_count": 0, "gpu_mem_gib": None, "vcpus": 1, "mem_gib": None,
                    "pricing": "rate", "usd_per_hour": 7.2, "on_demand_usd_per_hour": None, "min_workers": 2,
                    "max_workers": 2, "replaces_preempted": None}],
    "remote": {"hosts": ["root@10.213.1.11", "root@10.213.1.12", "root@10.213.1.13"], "ssh_key": "/lab/key",
               "gpus_per_host": 0, "cpus_per_host": 1, "python": None, "install": True,
               "pip_index_url": "http://10.213.1.1:8765/simple", "pythons": ["/root/p/bin/python"] * 3,
               "ips": ["10.213.1.11", "10.213.1.12", "10.213.1.13"],
               "temp_dirs": ["/tmp/gg-1a2b3c4d-0", "/tmp/gg-1a2b3c4d-1", "/tmp/gg-1a2b3c4d-2"],
               "token_path": "~/.gpugeek/clusters/1a2b3c4d/auth_token", "gcs_port": 6379, "keeper_port": 10002,
               "head_ip": "10.213.1.11", "line_address": "127.0.0.1:41234",
               "guard_home": "~/.gpugeek/clusters/1a2b3c4d/head", "later": {"a key": "of a version to come"}},
}


def changes(source: str) -> list[tuple[int, str]]:
    """Every change to a remote record in ``source``, as (line, what): an assignment to a spec's
    ``remote`` or into one (attribute, item), ``setattr`` on one, ``dataclasses.replace`` of one or
    with ``remote=``, a mutating method called on one or on a field of one, and the registry's
    merge of remote keys. A name bound to a record (``remote = spec.remote``, a parameter typed
    ``Remote``) is followed within its function."""
    tree, found = ast.parse(source), []
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        aliases = _aliases(scope)

        def reaches(node: ast.AST, aliases=aliases) -> bool:
            return _reaches(node, aliases)

        for node in _own_nodes(scope):
            for target in _targets(node):
                if (isinstance(target, ast.Attribute) and target.attr == "remote") or (
                        isinstance(target, (ast.Attribute, ast.Subscript)) and reaches(target.value)):
                    found.append((node.lineno, f"assignment to {ast.unparse(target)}"))
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name in ("setattr", "object.__setattr__", "delattr") and node.args and (
                    reaches(node.args[0]) or (len(node.args) > 1 and _constant(node.args[1]) == "remote")):
                found.append((node.lineno, f"{name} on a remote record"))
            elif name in ("replace", "dataclasses.replace") and (
                    (node.args and reaches(node.args[0])) or any(k.arg == "remote" for k in node.keywords)):
                found.append((node.lineno, "dataclasses.replace of a remote record"))
            elif isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS and reaches(node.func.value):
                found.append((node.lineno, f"{node.func.attr}() on {ast.unparse(node.func.value)}"))
            elif name == "registry.update" and any(k.arg == "remote" for k in node.keywords):
                found.append((node.lineno, "registry.update(remote=…)"))
    return sorted(set(found))


def _reaches(node: ast.AST, aliases: set[str]) -> bool:
    """Whether ``node`` is a remote record or a part of one."""
    if isinstance(node, ast.Attribute):
        return node.attr == "remote" or _reaches(node.value, aliases)
    if isinstance(node, ast.Subscript):
        return _reaches(node.value, aliases)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
        return len(node.args) > 1 and _constant(node.args[1]) == "remote"
    return isinstance(node, ast.Name) and node.id in aliases


def _aliases(scope: ast.AST) -> set[str]:
    """Names in ``scope`` bound to a remote record or a part of one."""
    names: set[str] = set()
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names |= {a.arg for a in scope.args.args + scope.args.kwonlyargs
                  if a.annotation is not None and "Remote" in ast.unparse(a.annotation)}
    for _ in range(3):      # an alias of an alias
        for node in _own_nodes(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    pairs = zip(target.elts, node.value.elts, strict=False) if isinstance(target, ast.Tuple) and (
                        isinstance(node.value, ast.Tuple)) else [(target, node.value)]
                    names |= {t.id for t, v in pairs if isinstance(t, ast.Name) and _of_remote(v, names)}
    return names


def _of_remote(node: ast.AST, names: set[str]) -> bool:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and node.attr == "remote":
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id in names


def _own_nodes(scope: ast.AST):
    """The nodes of ``scope`` outside the functions defined in it (each is a scope of its own)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        todo = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        todo = [node.target]
    elif isinstance(node, ast.Delete):
        todo = list(node.targets)
    else:
        return []
    out = []
    while todo:
        target = todo.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            todo.extend(target.elts)
        elif isinstance(target, ast.Starred):
            todo.append(target.value)
        else:
            out.append(target)
    return out


def _constant(node: ast.AST):
    return node.value if isinstance(node, ast.Constant) else None


def test_nothing_in_the_package_changes_a_remote_record_but_learn():
    outside = {str(path.relative_to(PACKAGE)): found for path in sorted(PACKAGE.rglob("*.py"))
               if path != WRITER and (found := changes(path.read_text()))}
    assert not outside, f"a remote record changed outside cluster/remote.py's learn: {outside}"
    assert changes(WRITER.read_text()), "learn itself is found: the finder reads what it should"


@pytest.mark.parametrize("code, what", [
    ("spec.remote = {'hosts': []}", "assignment to spec.remote"),
    ("spec.remote.hosts = ('a',)", "assignment to spec.remote.hosts"),
    ("spec.remote['ips'] = []", "assignment to spec.remote['ips']"),
    ("spec.remote.gcs_port += 1", "assignment to spec.remote.gcs_port"),
    ("def f(spec):\n    remote = spec.remote\n    remote.update(head_ip='x')", "update() on remote"),
    ("def f(spec):\n    remote, hosts = spec.remote, 3\n    remote['a'] = 1", "assignment to remote['a']"),
    ("def f(r: Remote):\n    object.__setattr__(r, 'head_ip', 'x')", "object.__setattr__ on a remote record"),
    ("setattr(spec, 'remote', other)", "setattr on a remote record"),
    ("setattr(spec.remote, 'head_ip', 'x')", "setattr on a remote record"),
    ("spec = dataclasses.replace(spec, remote=r)", "dataclasses.replace of a remote record"),
    ("r = replace(spec.remote, head_ip='x')", "dataclasses.replace of a remote record"),
    ("spec.remote.ips.append('10.0.0.1')", "append() on spec.remote.ips"),
    ("def f(spec):\n    ips = spec.remote.ips\n    ips.extend(['x'])", "extend() on ips"),
    ("getattr(spec, 'remote').setdefault('k', 1)", "setdefault() on getattr(spec, 'remote')"),
    ("registry.update(1, remote={'line_address': 'x'})", "registry.update(remote=…)"),
])
def test_the_finder_finds_each_kind_of_change(code, what):
    assert [w for _, w in changes(code)] == [what]


@pytest.mark.parametrize("code", [
    "host = spec.remote.hosts[0]", "ref = actor.update.remote(3)", "remote = spec.remote\nprint(remote.ips)",
    "options = dict(spec.remote.to_json())\noptions.update(a=1)", "record = registry.update(1, spec={})",
])
def test_the_finder_passes_reads(code):
    assert changes(code) == []


def test_a_record_cannot_be_changed_in_place():
    record = Remote(hosts=("root@h1",), ips=("10.0.0.1",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.head_ip = "10.0.0.1"
    with pytest.raises(AttributeError):
        record.ips.append("10.0.0.2")       # a tuple
    spec = ClusterSpec.from_json(BEFORE)
    assert all(isinstance(getattr(spec.remote, f.name), tuple) for f in dataclasses.fields(Remote)
               if typing.get_origin(typing.get_type_hints(Remote)[f.name]) is tuple)


def test_its_fields_and_every_facts_are_typed_and_a_fact_sets_fields_the_record_has():
    hints = typing.get_type_hints(Remote)
    for name, hint in hints.items():
        assert hint is not typing.Any and "Any" not in str(hint) and typing.get_origin(hint) is not dict, name
    for fact in FACTS:
        declared = typing.get_type_hints(fact)
        assert declared, fact
        for name, hint in declared.items():
            assert name in hints, f"{fact.__name__}.{name}: not a field of the record"
            theirs = hints[name]     # a fact may say a value the record may lack (``str`` for ``str | None``)
            fits = {theirs, *(a for a in typing.get_args(theirs) if a is not type(None))} if (
                typing.get_origin(theirs) in (typing.Union, types.UnionType)) else {theirs}
            assert hint in fits, f"{fact.__name__}.{name}: {hint}, the record's is {theirs}"
    assert typing.get_type_hints(ClusterSpec)["remote"] is Remote


def test_a_record_the_version_before_wrote_loads_as_it_was_and_goes_back_the_same():
    spec = ClusterSpec.from_json(json.loads(json.dumps(BEFORE)))
    remote = spec.remote
    assert remote.hosts == tuple(BEFORE["remote"]["hosts"]) and remote.head == "root@10.213.1.11"
    assert (remote.head_ip, remote.gcs_port, remote.keeper_port) == ("10.213.1.11", 6379, 10002)
    assert remote.line_address == "127.0.0.1:41234" and remote.temp_dirs[2] == "/tmp/gg-1a2b3c4d-2"
    assert (remote.known_hosts, remote.guard_pid, remote.extra) == (None, None, ())   # not written then
    written = json.loads(json.dumps(spec.to_json()))
    for key, value in BEFORE["remote"].items():
        if key != "later":
            assert written["remote"][key] == value, key
    assert "later" not in written["remote"]
    assert ClusterSpec.from_json(written) == spec
    assert ClusterSpec.from_json({**BEFORE, "remote": {}}).remote == Remote()    # a local cluster's


def test_learn_applies_facts_and_writes_them_merged_once(gpugeek_home, monkeypatch):
    """One write per call, merged into the stored record: what another process learned there
    meanwhile (a reopened tunnel's line) is kept."""
    record = registry.create("learned", "ssh", ClusterSpec.from_json({**BEFORE, "remote": {
        "hosts": BEFORE["remote"]["hosts"]}}).to_json(), simulated=False, budget_usd=None, idle_minutes=None)
    spec = ClusterSpec.from_json(record.spec)
    learn(spec, Found(pythons=("python3",) * 3, ips=("10.0.0.1", "10.0.0.2", "10.0.0.3")))
    assert spec.remote.ips[0] == "10.0.0.1" and registry.get(record.id).spec["remote"]["ips"] == []
    other = ClusterSpec.from_json(record.spec)       # another process's copy
    learn(other, LineOpened(line_address="127.0.0.1:5000"), record_id=record.id)
    writes, write = [], registry.update
    monkeypatch.setattr(registry, "update", lambda *a, **k: (writes.append(k), write(*a, **k)))
    learn(spec, Found(pythons=("python3",) * 3, ips=("10.0.0.1", "10.0.0.2", "10.0.0.3")),
          LaidOut(temp_dirs=("/t0", "/t1", "/t2"), token_path="~/t", head_ip="10.0.0.1", gcs_port=6379,
                  keeper_port=10002), record_id=record.id, temp_dir="/cfg")
    assert len(writes) == 1
    stored = registry.get(record.id)
    assert stored.temp_dir == "/cfg"
    assert stored.spec["remote"]["line_address"] == "127.0.0.1:5000", "another process's write was lost"
    assert ClusterSpec.from_json(stored.spec).remote.temp_dirs == ("/t0", "/t1", "/t2")
    assert stored.spec["remote"]["hosts"] == BEFORE["remote"]["hosts"]
