"""Running an example script's `--help` for `test_example_help.py` and `test_example_help_cache.py`: the full parser
in the test zygote (`tests/processes.py`: torch and transformers imported already; the script imports `example_utils`,
and so runs the cache lookup, afresh), the cached answer as a real Python process under `-X importtime`, whose module
list shows what it imported. Each run is given its own help cache folder and an 100-column terminal."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from example_utils import help_cache

from ..conftest import PYTHON, REPO_ROOT
from ..helpers import env, run_python

SCRIPTS = sorted((REPO_ROOT / "examples").glob("*/run_*.py"))
HEAVY = {"torch", "transformers", "datasets"}  # what the full parser imports


def help_env(cache: Path, **extra: str) -> dict[str, str]:
    return env(**{help_cache.CACHE_ENV: str(cache), "COLUMNS": "100", **extra})


def full_parser(script: Path, *args: str, cache: Path, **extra: str) -> subprocess.CompletedProcess:
    return run_python([script.name, *args], cwd=script.parent, env=help_env(cache, **extra))


def cached_answer(script: Path, *args: str, cache: Path, **extra: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The script run as a fresh interpreter; with the top-level modules it imported (`-X importtime`)."""
    command = [PYTHON, "-X", "importtime", script.name, *args]
    result = subprocess.run(command, cwd=script.parent, env=help_env(cache, **extra), capture_output=True, text=True)
    modules = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    return result, modules


def copy_of_qa(tmp_path: Path) -> Path:
    """A copy of examples/question-answering to edit (its script, the modules beside it, its ipu_config.json)."""
    folder = tmp_path / "question-answering"
    shutil.copytree(REPO_ROOT / "examples" / "question-answering", folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder / "run_qa.py"
