"""The process that runs the documentation's code for `tests/test_docs.py`, started once per test session.

It runs as `python tests/docs_kernel.py` in a fresh interpreter, so the blocks never touch the pytest process, and
their imports (torch, transformers) are paid once. Protocol: one JSON request a line on stdin, one JSON reply a line
on the process's original stdout (the blocks' own output, Python's or a library's, goes to stderr):

- `{"op": "run", "page": ..., "cwd": ..., "name": ..., "line": ..., "code": ...}` runs a Python block in the
  page's namespace (a fresh one for each page: the blocks of a page share state in order, like a notebook), in the
  page's folder. Reply: `{"ok": bool, "output": the block's printed text, "error": the traceback}`.
- `{"op": "names", "code": ..., "name": ...}` compiles a block and resolves the names it imports from
  `optimum_ipu`. Reply: `{"ok": bool, "error": ...}`.
- `{"op": "command", "words": [...]}`: for a command that runs an example or benchmark script, a module
  (`python -m`), `optimum-ipu`, or one of them under `torchrun` / `accelerate launch` (whose options their own
  parsers check), runs the program up to its argument parser, parses the arguments there (required flags need not
  be given: a fragment may leave them out) and stops it before anything else runs. Reply: `{"ok": bool, "error":
  the parser's message, or the unknown flags}`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import runpy
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class _Parsed(BaseException):  # noqa: N818 - not an error: the signal that the parser ran (passes `except Exception`)
    """Raised in place of going on once the program's parser has parsed the arguments."""

    def __init__(self, unknown: list[str]) -> None:
        super().__init__(unknown)
        self.unknown = unknown


def _relax(parser: argparse.ArgumentParser) -> None:
    """Every option of `parser` and its subcommands' parsers made optional (a fragment may leave some out)."""
    for action in parser._actions:
        action.required = False
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _relax(sub)


def parse_only(run: Callable[[], Any], argv0: str, argv: list[str]) -> tuple[bool, str]:
    """Runs `run()` with `sys.argv = [argv0, *argv]` until its first argument parser parses, and stops it there.

    Returns:
        `(ok, message)`: ok when the parser accepted every argument; else the parser's error or the unknown ones.
    """
    original = argparse.ArgumentParser.parse_known_args
    depth = 0

    def parse_and_stop(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        nonlocal depth
        if depth:  # a subcommand's parser, called by its parent's: parse as usual
            return original(self, args, namespace)
        depth += 1
        try:
            _relax(self)
            _, unknown = original(self, args, namespace)
        finally:
            depth -= 1
        raise _Parsed(unknown)

    saved_argv, errors = sys.argv, io.StringIO()
    argparse.ArgumentParser.parse_known_args = parse_and_stop
    sys.argv = [argv0, *argv]
    try:
        with contextlib.redirect_stderr(errors):
            run()
    except _Parsed as parsed:
        if parsed.unknown:
            return False, f"unrecognized arguments: {' '.join(parsed.unknown)}"
        return True, ""
    except SystemExit as stop:
        return False, f"exit {stop.code}: {errors.getvalue().strip()[-2000:]}"
    except Exception:
        return False, f"{errors.getvalue().strip()[-1000:]}\n{traceback.format_exc()[-3000:]}"
    finally:
        argparse.ArgumentParser.parse_known_args = original
        sys.argv = saved_argv
    return False, "the program ran to its end without parsing its arguments"


def script_path(word: str) -> Path | None:
    """An example or benchmark script named as the docs name it (a path from the repository or its own folder)."""
    direct = REPO / word
    if direct.is_file():
        return direct
    matches = sorted(REPO.glob(f"examples/*/{Path(word).name}")) + sorted(REPO.glob(f"benchmarks/{word}"))
    return matches[0] if matches else None


def parse_checks(words: list[str]) -> list[tuple[str, str, list[str]]]:
    """The `(kind, target, argv)` parse requests of a command's words: none for a program that is not ours."""
    program = Path(words[0]).name
    if program == "optimum-ipu":
        return [("cli", "optimum-ipu", words[1:])]
    if program == "torchrun":
        from torch.distributed.run import get_args_parser

        launcher = get_args_parser().parse_args(words[1:])
        return parse_checks(["python", launcher.training_script, *launcher.training_script_args])
    if program == "accelerate" and words[1:2] == ["launch"]:
        from accelerate.commands.launch import launch_command_parser

        launcher = launch_command_parser().parse_args(words[2:])
        return parse_checks(["python", launcher.training_script, *launcher.training_script_args])
    if program.startswith("python") and len(words) > 1:
        if words[1] == "-m":
            module = importlib.util.find_spec(words[2])
            assert module, f"python -m {words[2]}: no such module"
            source = Path(module.origin).read_text(encoding="utf-8") if module.origin else ""
            return [("module", words[2], words[3:])] if "parse_args" in source else []
        if words[1].endswith(".py"):
            script = script_path(words[1])
            if script is None:
                assert not re.match(r"^(examples|benchmarks)/", words[1]), f"{words[1]}: no such script"
                return []  # the reader's own script (train.py): its own block is checked
            if "parse_args" not in script.read_text(encoding="utf-8"):
                return []
            return [("script", str(script), words[2:])]
    return []


def parse_request(kind: str, target: str, argv: list[str]) -> tuple[bool, str]:
    """A `parse` request: an example or benchmark script (a path), a module run with `-m`, or `optimum-ipu`."""
    if kind == "cli":
        from optimum_ipu.cli.main import main

        return parse_only(lambda: main(argv), "optimum-ipu", argv)
    if kind == "module":
        return parse_only(lambda: runpy.run_module(target, run_name="__main__", alter_sys=True), target, argv)
    script = Path(target)
    sys.path.insert(0, str(script.parent))  # its sibling modules, as `python script.py` has them
    try:
        return parse_only(lambda: runpy.run_path(str(script), run_name="__main__"), str(script), argv)
    finally:
        sys.path.remove(str(script.parent))


def imported_names(code: str, name: str) -> tuple[bool, str]:
    """Compiles a block and resolves every name it imports from `optimum_ipu` (a `names` request)."""
    import ast
    import importlib

    try:
        tree = ast.parse(code, filename=name)
        compile(tree, name, "exec")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "optimum_ipu":
                        importlib.import_module(alias.name)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "optimum_ipu":
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(module, alias.name) and not importlib.util.find_spec(f"{node.module}.{alias.name}"):
                        return False, f"`from {node.module} import {alias.name}`: no such name"
    except Exception:
        return False, traceback.format_exc()[-3000:]
    return True, ""


def run_block(namespace: dict[str, Any], code: str, name: str, line: int) -> tuple[bool, str, str]:
    """Runs a block in `namespace`; tracebacks name the markdown file and its own line numbers."""
    output = io.StringIO()
    try:
        compiled = compile("\n" * line + code, name, "exec")
        with contextlib.redirect_stdout(output):
            exec(compiled, namespace)
        return True, output.getvalue(), ""
    except BaseException:  # a block's SystemExit too: it fails the block, not the kernel
        return False, output.getvalue(), traceback.format_exc()


def serve() -> None:
    """Answers requests until stdin closes."""
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what the blocks print at the C level cannot corrupt the replies
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0), write_through=True)
    namespaces: dict[str, dict[str, Any]] = {}
    for request_line in sys.stdin:
        request = json.loads(request_line)
        if request["op"] == "run":
            os.chdir(request["cwd"])
            namespace = namespaces.setdefault(request["page"], {"__name__": "__main__"})
            ok, output, error = run_block(namespace, request["code"], request["name"], request["line"])
            reply = {"ok": ok, "output": output[-4000:], "error": error[-6000:]}
        elif request["op"] == "names":
            ok, error = imported_names(request["code"], request["name"])
            reply = {"ok": ok, "error": error}
        else:
            reply = {"ok": True, "error": ""}
            try:
                checks = parse_checks(request["words"])
            except (AssertionError, SystemExit) as err:  # a launcher's own parser, or a script that is not there
                checks, reply = [], {"ok": False, "error": f"{type(err).__name__}: {err}"}
            for kind, target, argv in checks:
                ok, error = parse_request(kind, target, argv)
                if not ok:
                    reply = {"ok": False, "error": error}
                    break
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    sys.path.pop(0)  # tests/ itself: a block's `import helpers` must not find the suite's modules
    serve()
