"""Runs one of Optimum Graphcore's notebooks (`tests/notebooks/optimum_graphcore/`) in order, as Jupyter would, after
the one changed import line: `python -m tests.notebooks.runner SPEC.json` in a fresh process.

The spec (`tests.notebooks.registry.Notebook.spec`) says what differs from running it online as written: the
stand-ins (`replace`: exact text of a cell and what runs in its place, each with its reason; a text that no longer
occurs fails the run, so a stand-in never outlives its cause) and the IPU-only cells (`not_applicable`: a cell that
holds the text is not run, and its reason is said in one line). Shell commands and IPython magics (`!pip install`,
`%load_ext`) are not run, said once. A cell's last expression is shown as Jupyter shows it (its `repr`, cut).
The run ends with one JSON line on stdout: `{"cells", "ran", "not_applicable", "shell_lines", "shell_only",
"stand_ins"}` (`shell_only`: cells of nothing but shell commands and magics); a failing cell ends it with its
traceback and exit 1.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

import nbformat

ONE_IMPORT_CHANGE = ("optimum.graphcore", "optimum_ipu")
SHELL_PREFIXES = ("!", "%")
TIMING_MAGICS = ("%%time", "%%timeit")


def code_cells(path: Path) -> list[str]:
    """The code cells of a notebook, in order."""
    notebook = nbformat.read(path, as_version=4)
    return [cell.source for cell in notebook.cells if cell.cell_type == "code"]


def without_shell_lines(source: str) -> tuple[str, int]:
    """The cell without its shell commands and magics, and how many lines were left out: a `%%time` / `%%timeit`
    cell runs its code once, another cell magic drops the cell."""
    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith(TIMING_MAGICS):  # the cell's code runs (once), as Jupyter runs it
        return without_shell_lines("\n".join(lines[1:]))[0], 1
    if lines and lines[0].lstrip().startswith("%%"):  # another cell magic (%%bash, %%writefile): not Python
        return "", len(lines)
    kept = [line for line in lines if not line.lstrip().startswith(SHELL_PREFIXES)]
    return "\n".join(kept), len(lines) - len(kept)


def run_cell(source: str, namespace: dict[str, Any]) -> None:
    """Execute a cell; a last expression's value is shown, as Jupyter shows it."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), namespace)  # noqa: S102 - running the notebook is the point
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)  # noqa: S307
        if value is not None:
            print(repr(value)[:300])


def apply_stand_ins(cells: list[str], replace: list[list[str]]) -> tuple[list[str], list[str]]:
    """Each `[old, new, why]` applied where `old` occurs; returns the cells and the `old` texts found nowhere."""
    unused = []
    for old, new, _why in replace:
        if not any(old in cell for cell in cells):
            unused.append(old)
        cells = [cell.replace(old, new) for cell in cells]
    return cells, unused


def run(spec: dict[str, Any]) -> dict[str, Any]:
    cells = [cell.replace(*ONE_IMPORT_CHANGE) for cell in code_cells(Path(spec["notebook"]))]
    cells, unused = apply_stand_ins(cells, spec.get("replace", []))
    if unused:
        raise SystemExit(f"stand-ins whose text is not in the notebook any more: {unused}")
    # the cells' globals are a module registered as `__main__`, as IPython's are: `dill` (datasets.map's hashing)
    # pickles the functions of `__main__` by reference, not by value with every global they see
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    namespace: dict[str, Any] = main.__dict__
    summary = {"cells": len(cells), "ran": 0, "not_applicable": 0, "shell_lines": 0, "shell_only": 0}
    summary["stand_ins"] = len(spec.get("replace", []))
    for index, cell in enumerate(cells):
        reason = next((why for text, why in spec.get("not_applicable", []) if text in cell), None)
        if reason is not None:
            print(f"[cell {index}] not run here: {reason}", flush=True)
            summary["not_applicable"] += 1
            continue
        source, shell_lines = without_shell_lines(cell)
        summary["shell_lines"] += shell_lines
        if not source.strip():
            summary["shell_only"] += 1
            continue
        started = time.perf_counter()
        try:
            run_cell(source, namespace)
        except BaseException:
            print(f"[cell {index}] failed:\n{source}", file=sys.stderr)
            traceback.print_exc()
            raise SystemExit(1) from None
        summary["ran"] += 1
        print(f"[cell {index}] {time.perf_counter() - started:.2f} s", file=sys.stderr, flush=True)  # where time goes
    if summary["shell_lines"]:
        print(f"{summary['shell_lines']} shell command and magic lines not run (package installs, Graphcore's logger)")
    return summary


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    os.chdir(spec["cwd"])
    for folder in spec.get("folders", []):
        os.makedirs(folder, exist_ok=True)
    # the stand-in downloads: read where the Hub's files are read, at call time (this process forked from a zygote
    # that imported huggingface_hub already, so its environment variable alone would come too late)
    import huggingface_hub.constants

    os.environ["HF_HUB_CACHE"] = huggingface_hub.constants.HF_HUB_CACHE = spec["hub_cache"]
    os.environ["MPLBACKEND"] = "Agg"
    summary = run(spec)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
