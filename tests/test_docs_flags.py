"""Every flag of a ``%gpugeek`` magic and every option of the ``gpugeek`` command is documented:
a help text in its declaration (the reference is generated from it) and a mention on a how-to
page (docs/how-to/, docs/machines/), where people look for what a flag is for. A flag added to
the code without both fails here."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
HOW_TO = ("how-to", "machines")


def how_to_text() -> str:
    return "\n".join(p.read_text() for folder in HOW_TO for p in sorted((DOCS / folder).glob("*.md")))


def magic_parsers() -> dict[str, argparse.ArgumentParser]:
    from gpugeek_jupyter.magics.flags import SUBCOMMANDS

    return {f"%gpugeek {name}": func.parser for name, func in SUBCOMMANDS.items()}


def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    from gpugeek_jupyter.cli import _parser

    top = _parser()
    found = {"gpugeek": top}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update({f"gpugeek {name}": sub for name, sub in action.choices.items()})
    return found


def undocumented(parsers: dict[str, argparse.ArgumentParser], pages: str) -> list[str]:
    """The verdict: each flag with no help text, or mentioned on no how-to page, and why."""
    missing = []
    for command, parser in parsers.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            # a positional: its help (one that hands the rest of the line to another parser, as
            # `gpugeek up` does to %gpugeek up's, is that parser's to document)
            if not action.option_strings and action.nargs != argparse.REMAINDER and not (action.help or "").strip():
                missing.append(f"{command} {action.metavar or action.dest}: no help text in its declaration")
            for flag in (s for s in action.option_strings if s.startswith("--")):
                if not (action.help or "").strip():
                    missing.append(f"{command} {flag}: no help text in its declaration")
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", pages):
                    missing.append(f"{command} {flag}: on no how-to page (docs/how-to/, docs/machines/)")
    return missing


def test_every_magic_flag_is_documented():
    missing = undocumented(magic_parsers(), how_to_text())
    assert not missing, "give each a help text and say what it is for on a how-to page:\n" + "\n".join(missing)


def test_every_cli_option_is_documented():
    missing = undocumented(cli_parsers(), how_to_text())
    assert not missing, "give each a help text and say what it is for on a how-to page:\n" + "\n".join(missing)


def test_the_verdict_names_a_flag_added_without_docs():
    """The check itself, against a declaration the way the magics make theirs."""
    from IPython.core.magic_arguments import argument, magic_arguments

    @magic_arguments()
    @argument("name", nargs="?")
    @argument("--documented", help="said here")
    @argument("--no-help-text")
    @argument("--only-help", help="but on no page")
    def fake(line):
        """A subcommand."""

    pages = "Use `--documented X` and `--no-help-text`, never --only-helpful."
    assert undocumented({"%gpugeek fake": fake.parser}, pages) == [
        "%gpugeek fake name: no help text in its declaration",
        "%gpugeek fake --no-help-text: no help text in its declaration",
        "%gpugeek fake --only-help: on no how-to page (docs/how-to/, docs/machines/)",
    ]


def test_a_flag_added_to_a_real_magic_fails_the_check(monkeypatch):
    """A new flag on ``%gpugeek up`` (say ``--requeue``), declared with help but on no page."""
    parsers = magic_parsers()
    up = parsers["%gpugeek up"]
    monkeypatch.setattr(up, "_actions", list(up._actions))
    up._actions.append(argparse.Action(["--a-flag-nobody-wrote-up"], "x", help="a new flag"))
    assert "%gpugeek up --a-flag-nobody-wrote-up: on no how-to page (docs/how-to/, docs/machines/)" in undocumented(
        {"%gpugeek up": up}, how_to_text())


def test_every_setting_read_is_declared():
    """``config.settings()`` reads only keys of ``config.KEYS``, the one table the reference and the
    defaults come from."""
    import ast
    import inspect

    from gpugeek_jupyter import config

    declared = {k.name for k in config.KEYS} | {k.table for k in config.KEYS}
    read = {node.args[0].value for node in ast.walk(ast.parse(inspect.getsource(config)))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)}
    assert read - {"GPUGEEK_HOME"} <= declared, read - declared
