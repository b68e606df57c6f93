"""Every example script's `--help` answered from the text its full parser cached (example_utils/help_cache.py, issue
29): the same bytes, without importing torch, transformers or datasets."""

from __future__ import annotations

import pytest

from .help_runs import HEAVY, SCRIPTS, cached_answer, full_parser


@pytest.mark.parametrize("script", SCRIPTS, ids=[f"{script.parent.name}/{script.name}" for script in SCRIPTS])
def test_help_is_the_full_parsers_text_without_importing_torch(tmp_path, script):
    full = full_parser(script, "--help", cache=tmp_path)
    assert full.returncode == 0, full.stderr
    assert full.stdout.startswith(f"usage: {script.name} ") and "--ipu_config_name" in full.stdout
    assert len(list(tmp_path.glob(f"{script.stem}-*.json"))) == 1  # written by the full parser
    fast, modules = cached_answer(script, "--help", cache=tmp_path)
    assert fast.returncode == 0, fast.stderr[-2000:]
    assert fast.stdout == full.stdout  # the same bytes (text=True keeps "\n" as written)
    assert not modules & HEAVY, sorted(modules & HEAVY)
