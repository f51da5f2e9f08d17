"""One cluster model for every reader: ``ClusterModel`` (``guard/board.py``) is what the server's
JSON, the ``gpugeek`` command, ``status`` and ``clusters()`` carry, and ``ICluster`` in the front
end (``labextension/src/api.ts``) declares the same fields with the same types — read from the
TypeScript source here, field by field, nested interfaces and type aliases included."""

from __future__ import annotations

import re
import types
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from gpugeek_jupyter.guard import board
from gpugeek_jupyter.provision.status import ClusterStatus
from gpugeek_jupyter.vocab import ClusterPhase

API_TS = Path(__file__).resolve().parent.parent / "labextension" / "src" / "api.ts"
SCALARS = {int: "number", float: "number", str: "string", bool: "boolean", type(None): "null"}


def _ts_source() -> str:
    """api.ts without its comments."""
    text = re.sub(r"/\*.*?\*/", "", API_TS.read_text(), flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def ts_interface(name: str) -> dict[str, tuple[frozenset[str], bool]]:
    """``export interface NAME { … }`` as {field: (the union's members, optional)}; an alias
    (``export type X = …``) among the members is replaced by what it names."""
    source = _ts_source()
    found = re.search(rf"export interface {name}(?: extends \w+)? \{{(.*?)\n\}}", source, re.S)
    assert found, f"no interface {name} in {API_TS}"
    aliases = dict(re.findall(r"export type (\w+) = ([^;]+);", source))
    out = {}
    for field, optional, kind in re.findall(r"^\s*(\w+)(\??):\s*([^;]+);", found.group(1), re.M):
        members = set()
        for member in kind.split("|"):
            member = member.strip()
            members |= {m.strip() for m in aliases[member].split("|")} if member in aliases else {member}
        out[field] = (frozenset(members), bool(optional))
    return out


def ts_members(hint) -> frozenset[str]:
    """A Python annotation as the TypeScript union it must be written as."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return frozenset().union(*(ts_members(a) for a in typing.get_args(hint)))
    if origin is typing.Literal:
        return frozenset(f"'{a}'" for a in typing.get_args(hint))
    if typing.is_typeddict(hint):
        return frozenset({"I" + hint.__name__})
    assert hint in SCALARS, f"no TypeScript form for {hint!r}: add it to SCALARS"
    return frozenset({SCALARS[hint]})


def python_fields(declared) -> dict[str, tuple[frozenset[str], bool]]:
    hints = typing.get_type_hints(declared)
    return {name: (ts_members(hint), name in declared.__optional_keys__) for name, hint in hints.items()}


@pytest.mark.parametrize("python, ts", [(board.ClusterModel, "ICluster"), (board.Guard, "IGuard"),
                                        (board.GuardFailing, "IGuardFailing")])
def test_the_front_ends_interface_is_the_servers_model_field_by_field(python, ts):
    theirs, ours = ts_interface(ts), python_fields(python)
    assert set(theirs) == set(ours), f"{ts} lacks {set(ours) - set(theirs)}, has {set(theirs) - set(ours)} too"
    wrong = {name: (ours[name], theirs[name]) for name in ours if ours[name] != theirs[name]}
    assert not wrong, f"{ts} types differ from {python.__name__}: {wrong}"


def test_the_state_literal_is_every_phase():
    state = typing.get_type_hints(board.ClusterModel)["state"]
    assert set(typing.get_args(state)) == {p.value for p in ClusterPhase}


def test_the_reader_sees_an_interface_change(tmp_path, monkeypatch):
    """The TypeScript reader is not blind: a field renamed or retyped in api.ts is found."""
    changed = API_TS.read_text().replace("  detaches: boolean;", "  detaches: string;")
    monkeypatch.setattr(f"{__name__}.API_TS", tmp_path / "api.ts")
    (tmp_path / "api.ts").write_text(changed)
    assert ts_interface("ICluster")["detaches"] == (frozenset({"string"}), False)
    with pytest.raises(AssertionError, match="detaches"):
        test_the_front_ends_interface_is_the_servers_model_field_by_field(board.ClusterModel, "ICluster")


def test_the_model_status_and_clusters_share_names():
    """A record's model has exactly the declared keys; ``ClusterStatus`` and ``clusters()`` take
    theirs under the same names, with no field of their own renaming one."""
    from gpugeek_jupyter.cluster import registry

    record = registry.create("m", "attach", {}, simulated=False, budget_usd=5.0, idle_minutes=None)
    seen = board.model(registry.get(record.id))
    assert set(seen) == set(typing.get_type_hints(board.ClusterModel))
    assert seen["detaches"] is True and seen["state"] in {p.value for p in ClusterPhase}
    own = {"nodes", "events", "notes", "at"}      # what the status adds beside the model
    assert {f.name for f in fields(ClusterStatus)} - own <= set(seen)
    import gpugeek_jupyter as gg

    assert set(gg.clusters().columns) <= set(seen)
    registry.mark_stopped(record.id, "a record only")
