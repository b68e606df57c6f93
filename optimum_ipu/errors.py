"""Errors raised by optimum-ipu, and how scripts report them. Imports nothing heavy, so every layer can use them."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from .files import disk_full as _disk_full  # pure Python, as this module

MAX_ECHO = 200  # characters of a user's value an error message repeats
MAX_LINE = 200  # characters of the one line that says a file or an id is not found (with its fix, never cut)
DEBUG_ENV = "OPTIMUM_IPU_DEBUG"


class IncompatibleIPUConfigError(ValueError):
    """An `IPUConfig` (or a field of it) that is malformed or does not fit the model or the machine.

    The message names the field, the value given and what is allowed.
    """


class SkippedStepsError(FloatingPointError):
    """fp16 training skipped so many optimizer steps in a row (or every step) that it trains nothing.

    The message names the loss scale, the steps and the bound (`--max_consecutive_skipped_steps`).
    """


def short_repr(value: Any, limit: int = MAX_ECHO) -> str:
    """`repr(value)` cut to about `limit` characters, so that an error never echoes a huge value back."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int over Python's 4,300 digits, a self-nested list
        text = f"<{type(value).__name__}>"
    if len(text) <= limit:
        return text
    return f"{text[: limit - 30]}... ({len(text)} characters)"


# argparse's spellings of a boolean flag's value (transformers' `string_to_bool`)
TRUE_STRINGS, FALSE_STRINGS = ("true", "yes", "y", "t", "1"), ("false", "no", "n", "f", "0")


def checked_bool(name: str, value: Any, allow_none: bool = False) -> bool | None:
    """`value` of a boolean option as a `bool`: a `bool` (or `None` where `allow_none`), or one of the strings a
    command line gives (`"true"`, `"false"`, `"yes"`, `"no"`, `"1"`, `"0"`, ...). Anything else, `"false"`'s
    truthy string included, would switch the option on by mistake: a `ValueError` naming `name` and the value."""
    if isinstance(value, bool) or (value is None and allow_none):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE_STRINGS + FALSE_STRINGS:
        return value.strip().lower() in TRUE_STRINGS
    raise ValueError(f"{name}: got {short_repr(value)}; expected True or False")


def positive_int_setting(variable: str, default: int) -> int:
    """The positive integer an environment variable sets (a limit), or `default` when it is unset; a `ValueError`
    naming the variable and its value otherwise."""
    value = os.environ.get(variable, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{variable}: got {value!r}; expected a positive whole number")
    return int(value)


def elide(text: str, limit: int) -> str:
    """`text` cut in the middle to at most `limit` characters: the start (what is wrong) and the end (the fix) stay."""
    if len(text) <= limit:
        return text
    head = max(1, (limit - 5) * 2 // 5)
    return f"{text[:head]} ... {text[len(text) - (limit - 5 - head) :]}"


def _one_line(err: BaseException, limit: int = 1000) -> str:
    """The error's message on one line; a longer one loses its middle, never the fix at its end."""
    return elide(" ".join(str(err).split()) or type(err).__name__, limit)


def _debug_requested(argv: list[str]) -> bool:
    """`OPTIMUM_IPU_DEBUG=1`, or a bare `--debug` flag (removed from `argv`: `--debug VALUE` is transformers')."""
    for i, arg in enumerate(argv):
        if arg == "--debug" and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
            del argv[i]
            return True
    return debug_env()


def debug_env() -> bool:
    """Whether `OPTIMUM_IPU_DEBUG` asks for tracebacks (any value but empty, 0 or false)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0", "false", "False")


# OSError: a model or file that cannot be found or read (transformers reports a missing model as an OSError)
_BAD_INPUT = (ValueError, OSError)


def _exit_code(err: BaseException) -> int | None:
    """2 for a bad input, 1 for a run that stopped for a reason it names, None for a bug (traceback)."""
    if isinstance(err, FloatingPointError):
        return 1
    if _disk_full(err):
        return 1
    if isinstance(err, _BAD_INPUT):
        return 2
    if _collective_failed(err):
        return 1  # a collective failed or timed out (torch.distributed): another rank stopped or died
    return None


_COLLECTIVE_FAILURES = ("Timed out waiting", "Connection closed by peer", "Connection reset by peer", "NCCL")


def _collective_failed(err: BaseException) -> bool:
    if any(cls.__name__ in ("DistError", "DistBackendError") for cls in type(err).__mro__):
        return True
    return isinstance(err, RuntimeError) and any(text in str(err) for text in _COLLECTIVE_FAILURES)


# Notes added to a failed collective's one line by the modules that know more, as (module, function) names:
# `runtime.distributed` names the ranks whose heartbeat stopped. A note is read only from a module already loaded
# (one not loaded ran no heartbeat, so it has nothing to say), so this module imports nothing of the layers above.
COLLECTIVE_FAILURE_NOTES: tuple[tuple[str, str], ...] = (("optimum_ipu.runtime.distributed", "silent_ranks_note"),)


def _collective_failure_notes() -> str:
    """What the modules of `COLLECTIVE_FAILURE_NOTES` that are loaded say of a failed collective."""
    notes = []
    for module_name, function in COLLECTIVE_FAILURE_NOTES:
        module = sys.modules.get(module_name)
        if module is not None:
            notes.append(getattr(module, function)())
    return "".join(notes)


def run_script(main: Callable[[], Any], prog: str | None = None) -> None:
    """Run an example script's `main()`: a bad input ends in one line on stderr and exit code 2, a run stopped
    for a reason it names (an fp16 run that trains nothing, a full disk, a dead rank) in one line and exit code
    1, with no traceback unless `--debug` or `OPTIMUM_IPU_DEBUG=1` asks for one. Other exceptions (bugs) keep
    their traceback.
    """
    prog = prog or os.path.basename(sys.argv[0])
    debug = _debug_requested(sys.argv)
    try:
        main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as err:
        code = _exit_code(err)
        if debug or code is None:
            raise
        rank = os.environ.get("RANK")
        who = f"{prog} (rank {rank})" if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else prog
        message = _one_line(err) + (_collective_failure_notes() if _collective_failed(err) else "")
        if _disk_full(err) and "no space left" not in message.lower():
            message = f"No space left on device? {message}"
        line = f"{who}: error: {message}"
        hint = f" (set {DEBUG_ENV}=1 for the traceback)"
        print(line + hint if len(line + hint) < MAX_LINE else line, file=sys.stderr)  # a short line stays short
        sys.exit(code)
