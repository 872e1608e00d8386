"""Output comparison as programming contests do it: lines with trailing whitespace
ignored, trailing blank lines ignored, and optionally numbers within a tolerance."""

from __future__ import annotations

import math

__all__ = ["outputs_match"]


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _tokens_match(got: str, want: str, tolerance: float) -> bool:
    a, b = got.split(), want.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        fx, fy = _number(x), _number(y)
        if fx is None or fy is None:
            return False
        # absolute or relative, as checkers of floating-point answers accept
        if abs(fx - fy) > tolerance * max(1.0, abs(fy)):
            return False
    return True


def outputs_match(got: str, want: str, *, float_tolerance: float | None = None) -> bool:
    """Whether ``got`` is an accepted answer for ``want``.

    Exact after dropping each line's trailing whitespace and the trailing blank
    lines; with ``float_tolerance``, lines compare token by token and numeric
    tokens may differ by that much (absolute, or relative for numbers above 1).
    """
    a, b = _lines(got), _lines(want)
    if float_tolerance is None:
        return a == b
    if len(a) != len(b):
        return False
    return all(_tokens_match(x, y, float_tolerance) for x, y in zip(a, b, strict=True))
