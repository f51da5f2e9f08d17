"""``up``'s flags are declared where a user meets them — the magic's ``@argument``s (with their
help), ``gg.up``'s keywords (with their docstring) — and held here to the one shape they take
inside, ``UpRequest``: the same names and defaults, and every flag the magic parses reaching
``up`` with the value typed."""

from __future__ import annotations

import argparse
import inspect
from dataclasses import MISSING, fields

import pytest

import gpugeek_jupyter as gg
from gpugeek_jupyter import api, magics
from gpugeek_jupyter.provision import up as provision
from gpugeek_jupyter.provision.request import UpRequest

# the magic's flags that are not a field by the same name: --no-install is install=False
RENAMED = {"no_install": "install"}


def _request_fields() -> dict:
    return {f.name: f.default for f in fields(UpRequest)}


def _magic_actions() -> list[argparse.Action]:
    return [a for a in magics.up.parser._actions if not isinstance(a, argparse._HelpAction)]


def test_gg_up_and_the_request_have_the_same_keywords_and_defaults():
    request = _request_fields()
    for function in (provision.up, gg.up, api.up):
        params = inspect.signature(function).parameters
        assert set(params) == set(request), (function, set(params) ^ set(request))
        defaults = {name: p.default for name, p in params.items() if name not in ("name", "backend")}
        assert defaults == {k: v for k, v in request.items() if k not in ("name", "backend")}, function
        assert all(p.kind is p.KEYWORD_ONLY for name, p in params.items() if name != "name"), function
    assert request["name"] is MISSING and request["backend"] is MISSING   # filled in by UpRequest.of


def test_the_magic_parses_every_field_of_the_request():
    dests = {RENAMED.get(a.dest, a.dest) for a in _magic_actions()}
    assert dests == set(_request_fields()), dests ^ set(_request_fields())
    request = _request_fields()
    for action in _magic_actions():
        if action.dest in RENAMED or action.dest in ("name", "backend"):
            continue
        # a flag left out of a line means what leaving the keyword out of gg.up means
        assert action.default == request[action.dest], (action.dest, action.default, request[action.dest])


def _value_for(action: argparse.Action, index: int) -> tuple[str, object]:
    """A value of the flag's own kind, distinct per flag: what to type, and what up gets."""
    if action.dest == "pricing":
        return "spot", "spot"
    if action.dest == "plan":
        return "my_plan", "the plan object"
    typed = action.type("7") if action.type is not None else None
    if isinstance(typed, int):
        return str(index + 2), index + 2
    if isinstance(typed, float):
        return f"{index + 2}.5", index + 2.5
    return f"v{index}", f"v{index}"


def test_every_flag_of_the_magic_reaches_up_as_typed(ipython, monkeypatch):
    got = {}
    monkeypatch.setattr(api, "up", lambda *args, **kwargs: got.update(args=args, kwargs=kwargs))
    ipython.user_ns["my_plan"] = "the plan object"
    words, expected = ["my-cluster"], {}
    for index, action in enumerate(_magic_actions()):
        if not action.option_strings:
            continue
        if action.nargs == 0:                     # a switch
            words.append(action.option_strings[0])
            expected[RENAMED.get(action.dest, action.dest)] = action.dest not in RENAMED
        else:
            typed, value = _value_for(action, index)
            words += [action.option_strings[0], typed]
            expected[action.dest] = value
    ipython.run_line_magic("gpugeek", "up " + " ".join(words))
    assert got["args"] == ("my-cluster",)
    assert got["kwargs"] == expected
    assert set(expected) | {"name"} == set(_request_fields())


@pytest.mark.parametrize("flag", ["--no-install", "--dry-run"])
def test_a_switch_left_out_is_its_default(ipython, monkeypatch, flag):
    got = {}
    monkeypatch.setattr(api, "up", lambda *args, **kwargs: got.update(kwargs))
    ipython.run_line_magic("gpugeek", "up")
    assert got["install"] is True and got["dry_run"] is False and got["yes"] is False
    ipython.run_line_magic("gpugeek", f"up {flag}")
    assert got["install"] is (flag != "--no-install") and got["dry_run"] is (flag == "--dry-run")
