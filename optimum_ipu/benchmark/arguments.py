"""Checks of the benchmark's arguments, each error naming the flag: `run_benchmark` is called from Python as well as
from the command line, whose parser checks them first."""

from __future__ import annotations

from typing import Any


def check_integers(checked: tuple[tuple[str, Any, int], ...]) -> None:
    """Refuse any `(flag, value, low)` whose `value` is not an integer (a bool is not one) of at least `low`.

    Args:
        checked (`tuple[tuple[str, Any, int], ...]`): the flag as the error names it, its value, its least value.
    """
    for flag, value, low in checked:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{flag} {value!r}: expected an integer >= {low}")


__all__ = ["check_integers"]
