"""Fixtures of the notebook tests: the stand-in Hub cache and one call that runs a notebook."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ..conftest import REPO_ROOT
from ..processes import run_python
from .registry import BY_PATH, NOT_RUN
from .standins import write_hub_cache


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hub-cache")


@pytest.fixture
def run_notebook(hub_cache, tokenizer_for, shared_data, tmp_path):
    """`run_notebook(path)`: the notebook run in a fresh process; returns its summary and printed text."""

    def run(path: str, timeout: int = 600) -> tuple[dict, str]:
        notebook = BY_PATH[path]
        assert notebook.status != NOT_RUN, f"{path} is registered as not run"
        write_hub_cache(hub_cache, list(notebook.models), tokenizer_for, shared_data.parent / "models")
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps(notebook.spec(tmp_path, hub_cache)))
        done = run_python(["-m", "tests.notebooks.runner", str(spec)], cwd=REPO_ROOT, timeout=timeout)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
        times = os.environ.get("NOTEBOOK_CELL_TIMES")  # a file that collects each cell's seconds (to trim the slow)
        if times:
            with open(times, "a", encoding="utf-8") as f:
                f.write(f"== {path}\n" + "".join(line + "\n" for line in done.stderr.splitlines() if " s" in line))
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary["ran"] + summary["not_applicable"] + summary["shell_only"] == summary["cells"], summary
        for _text, reason in notebook.not_applicable:
            assert reason in done.stdout, f"the reason a cell does not apply is said: {reason}"
        return summary, done.stdout

    return run
