"""The flags the ``%gpugeek`` subcommands share, and the registry that names them.

Each parser only checks the flag's form (a number, a choice) and says what is wrong in one line
(IPython's ``UsageError``); the API checks ranges and meaning, so the two never disagree.
"""

from __future__ import annotations

from collections.abc import Callable

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument

from ..errors import GpugeekError
from ..units import number as checked
from ..units import parse_duration
from ..vocab import Choice, Pricing

Subcommand = Callable[..., object]      # (the magics object, the line[, the cell])
SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(func: Callable) -> Callable:
    """Register ``func`` as ``%gpugeek <name>``; its ``magic_arguments`` parser gets that prog."""
    func.parser.prog = f"%gpugeek {func.__name__}"
    SUBCOMMANDS[func.__name__] = func
    return func


def choice(kind: type[Choice], flag: str) -> Callable[[str], str]:
    """A flag whose value is one of ``kind``'s: checked by the vocabulary's one validator."""
    def parse(text: str) -> str:
        try:
            return kind.parse(text, flag).value
        except GpugeekError as exc:
            raise UsageError(str(exc)) from None
    parse.__name__ = flag.lstrip("-")         # argparse names the flag's type in its messages
    return parse


def flags(*arguments: Callable) -> Callable:
    """Several ``argument`` decorators as one, shared by the subcommands that take them (the way
    ipyparallel's magics share ``exec_args``/``output_args``)."""
    def apply(func: Callable) -> Callable:
        for add in reversed(arguments):
            func = add(func)
        return func
    return apply


def pricing_flag(help_text: str = "how the offer is bought") -> Callable:
    return argument("--pricing", default=Pricing.ON_DEMAND.value, type=choice(Pricing, "--pricing"),
                    metavar="|".join(Pricing.values()), help=help_text)


# what narrows the catalog, in offers, plan and the picker
offer_filters = flags(
    argument("--gpu", help="GPU families or provider spellings, comma-separated (H100,A100)"),
    argument("--provider", help="providers, comma-separated (aws,lambda)"),
    argument("--region", help="region or zone pattern (us-*, europe)"),
    argument("--residency", help="only offers in EU, EEA, UK, US, CA, CH, APAC or one country (DE)"),
    pricing_flag(),
    argument("--catalog", help="a CSV of your own offers (same columns as the bundled one)"),
)
# the cluster a command is about
cluster_name = argument("name", nargs="?", help="cluster name (default: the active one)")


def number(flag: str, kind: type = float, above: float | None = None,
           at_least: float | None = None) -> Callable[[str], float]:
    """A number flag's form (``kind``) and, where given, its floor, in ``units.number``'s words;
    the API checks the rest the same way."""
    def parse(text: str) -> float:
        try:
            return checked(text, flag, whole=kind is int, least=at_least, above=above)
        except GpugeekError as exc:
            raise UsageError(str(exc)) from None
    return parse


def positive_float(flag: str) -> Callable[[str], float]:
    return number(flag, float, above=0)


def positive_int(flag: str) -> Callable[[str], int]:
    return number(flag, int, at_least=1)


def span(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            return parse_duration(text, flag)
        except GpugeekError as exc:
            raise UsageError(str(exc)) from None
    return parse
