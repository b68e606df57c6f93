"""`LeaderStop` in one process: the rows its `rows_done` names end (a group's share of them when bound to a part of
the call), and a pickled copy, what a follower of `Lockstep` receives, ends nothing by itself. Across processes:
tests/distributed/test_generation_stages.py (rows and steps) and tests/serving/test_stages_torchrun.py (a gone
client under torchrun)."""

from __future__ import annotations

import pickle

import pytest
import torch

from optimum_ipu.runtime.lockstep import LeaderStop


def _done(stop: LeaderStop, rows: int) -> list[bool]:
    return stop(torch.zeros(rows, 3, dtype=torch.long), torch.zeros(rows, 5)).tolist()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_bound_copy_decides_its_part_of_the_rows(n):
    gone = {1, 4}  # prompts gone: rows prompt * n + i
    asked: list[int] = []

    def rows_done(rows: int) -> list[bool]:
        asked.append(rows)
        return [row // n in gone for row in range(rows)]

    stop = LeaderStop(rows_done)
    assert _done(stop, 6 * n) == [row // n in gone for row in range(6 * n)]
    parts = [range(0, 2), range(2, 4), range(4, 6)]
    for part in parts:  # (no process group: the part's flags alone)
        bound = stop.bound(None, part, prompts=6)
        assert _done(bound, len(part) * n) == [p in gone for p in part for _ in range(n)]
    assert asked == [6 * n] * 4  # each asked for the whole call's rows
    assert stop.group is None and stop.part is None  # binding copies, the original unchanged


def test_a_pickled_copy_leaves_rows_done_behind():
    stop = LeaderStop(lambda rows: [True] * rows).bound(None, range(0, 1), prompts=2)
    follower = pickle.loads(pickle.dumps(stop))
    assert follower.rows_done is None and follower.part is None
    assert _done(follower, 4) == [False] * 4 and _done(stop, 2) == [True, True]
