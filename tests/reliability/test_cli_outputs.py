"""The command line's outputs and numbers are checked before any measuring (issue 42, item 12): a NaN memory size,
a JSON file in a folder that is not there, and a results folder under a file are one line each, at once."""

from __future__ import annotations

import time

import pytest

from .test_bad_configs import cli_gives_one_line


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-2"])
def test_balance_memory_must_be_a_positive_number(value, reliability):
    cli_gives_one_line(
        reliability, ["config", "balance", "gpt2-config", "--n-ipu", "2", "--memory-gb", value], ("--memory-gb", value)
    )


def test_outputs_in_missing_or_impossible_folders_are_said_before_measuring(tmp_path, reliability):
    started = time.monotonic()
    json_path = str(tmp_path / "missing" / "balance.json")
    cli_gives_one_line(
        reliability,
        ["config", "balance", "gpt2-config", "--n-ipu", "2", "--json", json_path],
        ("--json", "is not there"),
    )
    (tmp_path / "a_file").write_text("x")
    under_file = str(tmp_path / "a_file" / "results")
    cli_gives_one_line(
        reliability, ["benchmark", "--steps", "1", "--output-dir", under_file], ("--output-dir", under_file)
    )
    assert time.monotonic() - started < 30, "refused before any model was built or timed"
