"""The reliability suite's counters, printed at the end of the run.

Tests record what they actually did through the `reliability` fixture: a fault injected (SIGKILL, an fp16
overflow, a NaN, a busy port) and whether the code survived it; a bad input tried and whether it gave a clear
error; a checkpoint verified; a cache entry verified. `pytest_terminal_summary` prints the totals, so the
figures are those of the tests that ran (a deselected or skipped test adds nothing; an expected failure adds a
try, not a success). The hooks that add the counts up (over `pytest-xdist` workers too), print and check them are
in `tests/conftest.py`: the controller of an xdist run loads that one only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from ..conftest import RELIABILITY_COUNTS as _COUNTS


@dataclass
class Reliability:
    """Counts of one session. Each `record_*` call counts one event; the helpers below count and check at once."""

    counts: Counter = field(default_factory=Counter)

    def fault_injected(self, n: int = 1) -> None:
        """`n` faults were injected (a kill, an overflow, a NaN, a busy port...)."""
        self.counts["faults injected"] += n

    def fault_survived(self, n: int = 1) -> None:
        """`n` injected faults were come through as specified (counted once that is verified)."""
        self.counts["faults survived"] += n

    def fault(self, survived: bool) -> bool:
        """One fault injected and checked at once; `survived` says whether the code came through it."""
        self.fault_injected()
        self.fault_survived(int(bool(survived)))
        return survived

    def bad_input(self, clear: bool) -> bool:
        """A bad input was tried; `clear` says whether it gave a clear error."""
        self.counts["bad inputs tried"] += 1
        self.counts["clear errors"] += bool(clear)
        return clear

    def checkpoint_verified(self, n: int = 1) -> None:
        self.counts["checkpoints verified"] += n

    def cache_verified(self, n: int = 1) -> None:
        """`n` cache entries were checked to be served only when whole and current (or rebuilt when not)."""
        self.counts["caches verified"] += n

    def expect_clear_error(
        self,
        call: Callable[[], Any],
        names: str | tuple[str, ...],
        errors: tuple[type[BaseException], ...] = (ValueError,),
    ) -> BaseException:
        """Run `call` on a bad input: it must raise one of `errors` (by default `ValueError`, which
        `IncompatibleIPUConfigError` is) whose message contains every string of `names` (the field, the record
        id...). Anything else (no error, another exception type, a message that does not name the field) is
        counted as unclear and fails the test."""
        names = (names,) if isinstance(names, str) else names
        try:
            call()
        except errors as err:
            message = str(err)
            clear = all(name in message for name in names) and "\n" not in message.strip()
            self.bad_input(clear)
            assert clear, f"unclear error for a bad input: {type(err).__name__}: {message!r} (expected {names})"
            return err
        except BaseException as err:
            self.bad_input(False)
            raise AssertionError(f"a bad input raised {type(err).__name__} from deep inside: {err!r}") from err
        self.bad_input(False)
        raise AssertionError(f"a bad input was accepted without an error (expected one naming {names})")


@pytest.fixture(scope="session")
def reliability(request: pytest.FixtureRequest) -> Reliability:
    """Session-wide counters (session scope: usable from hypothesis tests, which run many examples per call)."""
    counts = request.config.stash.setdefault(_COUNTS, Counter())
    return Reliability(counts)
