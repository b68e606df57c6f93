"""`run_*.py --help` in a fraction of a second: the help the full parser printed, cached per script.

A script's parser needs `IPUTrainingArguments`, which imports `transformers`' trainer, `torch` and (when installed)
`peft`: 6 to 13 seconds on a 2-core machine before argparse can print anything. The first time a script parses its
arguments (`--help` or any run), `store_help` writes what the parser's help is drawn from (`help_layout`) to
`$HF_HOME/optimum_ipu/help/` (`~/.cache/huggingface/...` by default; `OPTIMUM_IPU_HELP_CACHE=DIR` moves it,
`OPTIMUM_IPU_HELP_CACHE=off` turns it off). Afterwards `answer_help_from_cache`, called by `example_utils` before its
heavy imports, draws that help for the terminal at hand when the command line is exactly `-h` or `--help` and the entry
is fresh, then exits 0 as argparse does. `python -m example_utils.cache_help` (run by `make setup`) fills the cache
for every example script in one process, so that even a script's first `--help` is answered from it.

An entry is fresh only if nothing that shapes the text changed: its file name is a hash of the script's content and
path, `prog`, the locale variables gettext reads, the Python build and the installed versions of `optimum-ipu` and
`transformers`; inside, the SHA-256 of every source file that defined the arguments (the script, the modules beside
it, `example_utils`, `optimum_ipu`, and each argument dataclass's module and bases) is checked again before the help
is shown (an editable install keeps its version when its files change). Anything else (no entry, a stale one, an
unreadable cache) leaves the answer to the full parser. This module imports only the standard library.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
from collections.abc import Iterable
from typing import Any

from .help_layout import format_layout, parser_layout

CACHE_ENV = "OPTIMUM_IPU_HELP_CACHE"
_OFF = ("off", "0", "false", "no", "")
HELP_COMMAND_LINES = (["-h"], ["--help"])  # the only command lines answered from the cache
ENTRY_FORMAT = 2  # bumped when an entry's layout or key changes
VERSIONED_DISTRIBUTIONS = ("optimum-ipu", "transformers")
LOCALE_VARIABLES = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")  # gettext's, which translates argparse's headings
OWN_PACKAGES = ("example_utils", "optimum_ipu")


def cache_dir() -> str | None:
    """Where help texts are cached: `$OPTIMUM_IPU_HELP_CACHE`, else `$HF_HOME/optimum_ipu/help` (`HF_HOME` resolved
    as `huggingface_hub` does); `None` when `OPTIMUM_IPU_HELP_CACHE=off`."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in _OFF else os.path.expanduser(chosen)
    default_home = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
    hf_home = os.path.expandvars(os.path.expanduser(os.environ.get("HF_HOME", default_home)))
    return os.path.join(hf_home, "optimum_ipu", "help")


def main_script() -> str | None:
    """The file of the script being run (`__main__`), or `None` (an interactive session, `python -c`)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return os.path.realpath(path) if path and os.path.isfile(path) else None


def answer_help_from_cache() -> None:
    """
    When the command line is exactly `-h` or `--help` and a fresh help text of the running script is cached, print
    it as argparse would and exit 0; otherwise return (the full parser will answer, and cache its text).

    Raises:
        `SystemExit`: code 0, after printing the cached help.
    """
    if sys.argv[1:] not in HELP_COMMAND_LINES:
        return
    script = main_script()
    text = cached_help(script, os.path.basename(sys.argv[0])) if script else None
    if text is None:
        return
    try:  # argparse's _print_message: a closed stdout is no error
        sys.stdout.write(text)
    except (AttributeError, OSError):
        pass
    raise SystemExit(0)


def cached_help(script: str, prog: str) -> str | None:
    """The fresh cached help of `script` run as `prog`, or `None` (none cached, stale, unreadable or turned off)."""
    layout = _fresh_layout(script, prog)
    try:
        return None if layout is None else format_layout(layout, prog)
    except Exception:  # noqa: BLE001 -- an entry argparse cannot draw (damaged, another layout): the full parser answers
        return None


def _fresh_layout(script: str, prog: str) -> dict[str, Any] | None:
    """What the fresh entry of `script` run as `prog` draws its help from (not drawn here: a script that parses its
    arguments only asks whether the entry is fresh), or `None` as `cached_help` says."""
    path = entry_path(script, prog)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as file:
            entry = json.load(file)
        sources, layout = entry["sources"], entry["layout"]
        fresh = all(_file_digest(source) == digest for source, digest in sources.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return layout if fresh and isinstance(layout, dict) else None


def store_help(parser: Any, dataclass_types: Iterable[type]) -> None:
    """
    Cache the running script's help (`cache_help`) when it parses its own arguments (one of `dataclass_types`
    defined in `__main__`), not a test or a notebook calling `parse_args`.
    """
    types = list(dataclass_types)
    script = main_script()
    if script is not None and any(getattr(cls, "__module__", None) == "__main__" for cls in types):
        cache_help(script, parser, types)


def cache_help(script: str, parser: Any, dataclass_types: Iterable[type]) -> None:
    """
    Write what `parser.format_help()` draws from (`help_layout.parser_layout`) as the help of `script` run as
    `parser.prog`, with the digests of the sources that shaped it, unless a fresh entry is there already; remove the
    entries of the script's earlier contents. A parser whose help depends on more than the layout holds is not cached,
    nor is anything when the cache cannot be written (a read-only folder, a full disk): the script runs as without it.
    """
    path = entry_path(script, parser.prog)
    if path is None or _fresh_layout(script, parser.prog) is not None:
        return
    try:
        layout = parser_layout(parser)
        if layout is None:
            return
        classes = [*dataclass_types, type(parser)]  # + HfArgumentParser's module (an editable install)
        entry = {"sources": _sources(script, classes), "layout": layout}
        _write_atomically(path, json.dumps(entry, ensure_ascii=False))
        _prune(path)
    except Exception:  # noqa: BLE001 -- a help cache never stops a run (a help text argparse cannot format included)
        return


def entry_path(script: str, prog: str) -> str | None:
    """The cache file of `script`'s help as `prog`, named by a hash of everything outside the sources that shapes
    the text; `None` when the cache is off, the script unreadable or the help would be coloured (Python 3.14+ on a
    terminal)."""
    folder = cache_dir()
    if folder is None or _may_colour():
        return None
    script = os.path.realpath(script)
    try:
        with open(script, "rb") as file:
            script_digest = hashlib.sha256(file.read()).hexdigest()
    except OSError:
        return None
    key = {
        "format": ENTRY_FORMAT,
        "prog": prog,
        "locale": [os.environ.get(name) for name in LOCALE_VARIABLES],
        "python": sys.version,
        "versions": _versions(),
    }
    key_digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return os.path.join(folder, f"{_script_prefix(script)}{script_digest[:16]}-{key_digest[:24]}.json")


def _script_prefix(script: str) -> str:
    """`run_qa-<hash of its path>-`: every entry of one script file starts so (what `_prune` looks for)."""
    stem = os.path.splitext(os.path.basename(script))[0]
    return f"{stem}-{hashlib.sha256(script.encode()).hexdigest()[:12]}-"


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in VERSIONED_DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _may_colour() -> bool:
    """Whether argparse may colour the help (Python 3.14+, a terminal or FORCE_COLOR): its text is not cached then."""
    if sys.version_info < (3, 14):
        return False
    try:
        from _colorize import can_colorize
    except ImportError:
        return True
    return can_colorize(file=sys.stdout)


def _file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as file:
            return hashlib.sha256(file.read()).hexdigest()
    except OSError:
        return None


def _sources(script: str, classes: list[type]) -> dict[str, str | None]:
    """SHA-256 of each source that may shape the help: the script and the modules loaded from its folder, those of
    `example_utils` and `optimum_ipu`, and the module of every class in the MROs of `classes` (the argument
    dataclasses and the parser's class)."""
    script = os.path.realpath(script)
    folder = os.path.dirname(script)
    packages = [sys.modules[name] for name in OWN_PACKAGES if getattr(sys.modules.get(name), "__file__", None)]
    trees = [os.path.dirname(os.path.realpath(package.__file__)) for package in packages]
    files, real_dirs = {script}, {}  # realpath once per folder, not per module (thousands are loaded)
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        where, name = os.path.split(path)
        if where not in real_dirs:
            real_dirs[where] = os.path.realpath(where)
        path = os.path.join(real_dirs[where], name)
        if real_dirs[where] == folder or any(path.startswith(tree + os.sep) for tree in trees):
            files.add(os.path.realpath(path))
    for cls in classes:
        for base in cls.__mro__:
            path = getattr(sys.modules.get(base.__module__), "__file__", None)
            if path and path.endswith(".py"):
                files.add(os.path.realpath(path))
    return {path: _file_digest(path) for path in sorted(files)}


def _write_atomically(path: str, text: str) -> None:
    """`path` holds either its old content or all of `text` (several processes of one `torchrun` may write it)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    try:
        with open(partial, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _prune(path: str) -> None:
    """Remove the entries of earlier versions of the same script file (other keys of this one stay)."""
    folder, name = os.path.split(path)
    script_part = name.rsplit("-", 1)[0]  # prefix + the script's content hash
    prefix = script_part.rsplit("-", 1)[0] + "-"
    for other in os.listdir(folder):
        if other.startswith(prefix) and other.endswith(".json") and not other.startswith(script_part + "-"):
            try:
                os.remove(os.path.join(folder, other))
            except OSError:
                pass


def example_scripts() -> list[str]:
    """The example scripts of this checkout (`examples/*/run_*.py` beside `example_utils`), or none when
    `example_utils` is installed without them."""
    examples = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return sorted(glob.glob(os.path.join(examples, "*", "run_*.py")))


def warm(scripts: Iterable[str]) -> list[str]:
    """
    Cache the help of each of `scripts` by running it with `--help` in this process (its output discarded), so that
    their imports are paid once for all of them; the modules loaded from a script's folder are unloaded after it
    (two folders may hold modules of one name). Returns the scripts whose help is now cached.
    """
    import contextlib
    import io
    import runpy

    warmed = []
    for script in scripts:
        script = os.path.realpath(script)
        folder = os.path.dirname(script)
        argv, path, loaded = sys.argv, list(sys.path), set(sys.modules)
        sys.argv, sys.path[:0] = [script, "--help"], [folder]
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                runpy.run_path(script, run_name="__main__")
        except SystemExit:
            pass  # argparse's exit after printing the help
        finally:
            sys.argv, sys.path[:] = argv, path
            for name in set(sys.modules) - loaded:
                if os.path.dirname(os.path.realpath(getattr(sys.modules[name], "__file__", None) or "/")) == folder:
                    del sys.modules[name]
        if cached_help(script, os.path.basename(script)) is not None:
            warmed.append(script)
    return warmed
