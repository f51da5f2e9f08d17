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
        raise GpugeekError(f"{what} {text!r} must be a positive number")
    return value


def human_count(value: float) -> str:
    """The inverse of :func:`parse_count` for display: 7e9 → ``'7B'``."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def positive_number(value: object, flag: str) -> float | None:
    """``None`` stays ``None``; anything else must be a positive finite number (``'3'`` is fine)."""
    if value is None:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise GpugeekError(f"{flag} {value!r} is not a number") from None
    if not math.isfinite(number) or number <= 0:
        raise GpugeekError(f"{flag} {value!r} must be a positive number")
    return number


def whole_number(value: object, flag: str) -> int | None:
    """``None`` stays ``None``; anything else must be a whole number ≥ 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not str(value).strip().isdigit() or int(str(value)) < 1:
        raise GpugeekError(f"{flag} {value!r} must be a whole number ≥ 1")
    return int(str(value))


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
