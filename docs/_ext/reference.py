"""The reference pages, generated from the declarations the code parses.

``%gpugeek``'s subcommands from their ``magic_arguments`` parsers, the ``gpugeek`` command from
``cli._parser()``, the settings from ``config.KEYS``: a flag added to the code is in the
reference at the next build, and its help text with it.
"""

from __future__ import annotations

import argparse
import textwrap

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from docutils.statemachine import StringList


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """A parser's arguments as people type them (``-h`` left out)."""
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _names(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    shown = ", ".join(action.option_strings)
    if action.nargs == 0:
        return shown
    metavar = action.metavar or action.dest.upper()
    return f"{shown} {metavar}"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS, False):
        return ""
    return f" (default: `{action.default}`)"


def parser_rows(parser: argparse.ArgumentParser) -> list[str]:
    """A bullet list in reST: each argument, its help and its default."""
    rows = []
    formatter = parser._get_formatter()
    for action in options(parser):
        help_text = formatter._expand_help(action) if action.help else ""     # "80%%" → "80%", as -h says
        said = f" — {_escape(help_text)}" if help_text else ""
        rows.append(f"* ``{_names(action)}``{said}{_default(action).replace('`', '``')}")
    return rows or ["(no options)"]


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage lines as ``-h`` prints them (IPython's formatter opens them with a reST ``::``)."""
    lines = parser.format_usage().replace("usage: ", "").replace("%%", "%").splitlines()
    while lines and lines[0].strip() in ("", "::", "%::"):
        lines.pop(0)
    return textwrap.dedent("\n".join(lines)).strip()


def _escape(text: str) -> str:
    return text.replace("*", r"\*").replace("`", "``").replace("|", r"\|").replace("_", r"\_")


class _Generated(Directive):
    """Parse the reST lines a subclass makes, as if written in the page."""

    has_content = False
    section = True          # the lines hold titles (one section per command)

    def lines(self) -> list[str]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        holder = nodes.section() if self.section else nodes.container()
        holder.document = self.state.document
        self.state.nested_parse(StringList(self.lines(), source="(generated)"), self.content_offset, holder,
                                match_titles=self.section)
        return list(holder.children)


class MagicsDirective(_Generated):
    """Every ``%gpugeek`` subcommand: usage, summary, flags."""

    def lines(self) -> list[str]:
        from gpugeek_jupyter.magics import CELL_SUBCOMMANDS
        from gpugeek_jupyter.magics.flags import SUBCOMMANDS

        out: list[str] = []
        for name, func in SUBCOMMANDS.items():
            parser = func.parser
            magic = f"%%gpugeek {name}" if name in CELL_SUBCOMMANDS else f"%gpugeek {name}"
            usage = _usage(parser)
            if name in CELL_SUBCOMMANDS:
                usage = "%" + usage
            out += [f".. _magic-{name}:", "", magic, "-" * (len(magic) + 4), "",
                    _escape((parser.description or "").strip()), "", ".. code-block:: text", "",
                    *("    " + u for u in usage.splitlines()), "", *parser_rows(parser), ""]
        return out


class CliDirective(_Generated):
    """The ``gpugeek`` command and each of its subcommands."""

    def lines(self) -> list[str]:
        from gpugeek_jupyter.cli import _parser

        top = _parser()
        out = [".. code-block:: text", "", *("    " + u for u in _usage(top).splitlines()), "",
               *parser_rows(top), ""]
        for action in top._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in action._choices_actions}
                for name, sub in action.choices.items():
                    title = f"gpugeek {name}"
                    out += [f".. _cli-{name}:", "", title, "-" * (len(title) + 4), "",
                            _escape(helps.get(name) or ""), "", ".. code-block:: text", "",
                            *("    " + u for u in _usage(sub).splitlines()), "", *parser_rows(sub), ""]
        return out


class ConfigDirective(_Generated):
    """``config.toml``'s keys, table by table, from ``config.KEYS``."""

    section = False

    def lines(self) -> list[str]:
        from gpugeek_jupyter.config import KEYS

        out = [".. list-table::", "   :header-rows: 1", "", "   * - key", "     - default", "     - meaning"]
        for key in KEYS:
            out += [f"   * - ``[{key.table}] {key.name}``", f"     - ``{_toml(key.default)}``",
                    f"     - {_escape(key.help)}"]
        return out


def _toml(value: object) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, (list, tuple)):
        return "[]" if not value else repr(list(value))
    if isinstance(value, dict):
        return "{}" if not value else repr(value)
    return repr(value)


class ApiDirective(_Generated):
    """The Python API, name by name as the package exports it (``gpugeek_jupyter.API``, ``WIDGETS``),
    each from its docstring (autodoc)."""

    section = False

    def lines(self) -> list[str]:
        import inspect

        import gpugeek_jupyter
        from gpugeek_jupyter import api, widgets

        out: list[str] = []
        for names, module in ((gpugeek_jupyter.API, api), (gpugeek_jupyter.WIDGETS, widgets)):
            for name in names:
                obj = getattr(module, name)
                kind = "autoclass" if inspect.isclass(obj) else "autofunction"     # members: conf.py's default
                out += [f".. {kind}:: {module.__name__}.{name}", ""]
        return out


class InCellDirective(_Generated):
    """What a cell calls on ``gg`` on the workers (``workers.helper.IN_CELL``), each from its
    docstring, named as a cell writes it (``gg.prepare``)."""

    section = False

    def lines(self) -> list[str]:
        import inspect

        from gpugeek_jupyter.workers.helper import IN_CELL, Helper

        out: list[str] = []
        for name in IN_CELL:
            member = inspect.getattr_static(Helper, name)
            if isinstance(member, property):
                kind, shown, doc = "attribute", f"gg.{name}", inspect.getdoc(member.fget)
            else:
                signature = str(inspect.signature(member)).replace("(self, ", "(").replace("(self)", "()") \
                    .replace("'", "")       # the annotations as written, not as the strings they are here
                kind, shown, doc = "function", f"gg.{name}{signature}", inspect.getdoc(member)
            out += [f".. py:{kind}:: {shown}", "   :no-index:", ""]
            out += [f"   {line}" if line else "" for line in (doc or "").splitlines()] + [""]
        return out


def setup(app):
    directives.register_directive("gpugeek-magics", MagicsDirective)
    directives.register_directive("gpugeek-cli", CliDirective)
    directives.register_directive("gpugeek-config", ConfigDirective)
    directives.register_directive("gpugeek-api", ApiDirective)
    directives.register_directive("gpugeek-in-cell", InCellDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
