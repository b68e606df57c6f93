"""The heaviest test files first, so that `make test`'s two `pytest-xdist` workers finish together.

`--dist loadfile` hands each worker whole files, one after another, in collection order when xdist's own reordering
is off (`--no-loadscope-reorder`). That reordering puts the files with the most tests first, which left a file of one
long end-to-end run for last, on one worker, while the other sat idle. Here files are ordered by their measured
seconds (`tests/file_seconds.json`; a file not in it counts 0 and keeps its place among the others), longest first:
the classic longest-processing-time-first schedule. `OPTIMUM_IPU_RECORD_FILE_SECONDS=1 make test` writes the table
anew from the run.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
_RECORDED: Counter = Counter()  # this process's reports: under xdist, the controller gets every worker's


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[Any]) -> None:
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
    items.sort(key=lambda item: -seconds.get(_file_of(item.nodeid), 0.0))  # stable: each file's tests keep order


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get("OPTIMUM_IPU_RECORD_FILE_SECONDS") == "1":
        _RECORDED[_file_of(report.nodeid)] += report.duration  # setup, call and teardown


def record_file_seconds(config: pytest.Config) -> None:
    """Write the seconds each file took (the controller's view: under xdist every worker's reports reach it)."""
    if _RECORDED and getattr(config, "workeroutput", None) is None:
        table = {name: round(s, 1) for name, s in sorted(_RECORDED.items(), key=lambda kv: -kv[1])}
        FILE_SECONDS.write_text(json.dumps(table, indent=1) + "\n")
