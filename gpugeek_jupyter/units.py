"""Parse the numbers people type: ``7B`` parameters, ``2T`` tokens, ``80GiB``."""

from __future__ import annotations

import math
import re

from .errors import GpugeekError

_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*$")


def parse_count(text: str | float | int, what: str = "number") -> float:
    """``'7B'`` → 7e9, ``'350M'`` → 3.5e8, ``'1.3e9'`` → 1.3e9; one clear error otherwise."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _COUNT.match(str(text))
        if not match:
            raise GpugeekError(
                f"{what} {text!r} is not a number — write it like 7B, 350M, 2T or 1.3e9"
            )
        value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if not math.isfinite(value) or value <= 0:
        raise GpugeekError(f"{what} {text!r} must be a positive number — give one")
    return value


def human_count(value: float) -> str:
    """The inverse of :func:`parse_count` for display: 7e9 → ``'7B'``."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def number(value: object, flag: str, *, whole: bool = False, least: float | None = None,
           above: float | None = None, hint: str = "") -> float | None:
    """The one check of a number someone typed, with one wording: ``None`` stays ``None``;
    anything else must be a finite number (``'3'`` is fine; a whole one with ``whole``), at least
    ``least`` or more than ``above``. Otherwise one line: ``FLAG VALUE is not a (whole) number`` or
    ``FLAG VALUE must be a (whole) number ≥ N`` (``> N``), then ``hint``."""
    if value is None:
        return None
    noun = "whole number" if whole else "number"
    try:
        if isinstance(value, bool):
            raise ValueError
        parsed = float(value)  # type: ignore[arg-type]
        if whole and not parsed.is_integer():
            raise ValueError
    except (TypeError, ValueError):
        raise GpugeekError(f"{flag} {value!r} is not a {noun}{hint} — give one") from None
    if not (math.isfinite(parsed) and (least is None or parsed >= least) and (above is None or parsed > above)):
        bound = f" ≥ {least:g}" if least is not None else f" > {above:g}" if above is not None else ""
        raise GpugeekError(f"{flag} {value!r} must be a{' finite' if not bound else ''} {noun}{bound}{hint} — give one")
    return int(parsed) if whole else parsed


def positive_number(value: object, flag: str) -> float | None:
    """``None`` stays ``None``; anything else must be a number > 0 (``number``'s wording)."""
    return number(value, flag, above=0)


def whole_number(value: object, flag: str) -> int | None:
    """``None`` stays ``None``; anything else must be a whole number ≥ 1 (``number``'s wording)."""
    return number(value, flag, whole=True, least=1)


_SPAN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([smhd])\s*$")
_SPAN_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, what: str = "duration") -> float:
    """``'90s'``, ``'30m'``, ``'2h'``, ``'7d'`` → seconds; one clear error otherwise."""
    match = _SPAN.match(str(text).lower())
    if not match or float(match.group(1)) <= 0:
        raise GpugeekError(f"{what} {text!r} is not a span of time — write it like 90s, 30m, 2h or 7d")
    return float(match.group(1)) * _SPAN_S[match.group(2)]


def duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h10m``; ``—`` for unknown."""
    if seconds is None:
        return "—"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def clock(at: float) -> str:
    """A moment as the local time of day, ``14:02:07``: when a cluster was last heard from, a
    streak of failures began."""
    import time

    return time.strftime("%H:%M:%S", time.localtime(at))
