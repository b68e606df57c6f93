"""The pieces of generation in groups in flight (`optimum_ipu.runtime.stages.groups`), in one process: the rotation of
turns, the rows of each group, the joined outputs and streamer. Across processes: tests/distributed/
test_generation_stages.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from optimum_ipu.runtime.lockstep import Lanes
from optimum_ipu.runtime.stages.groups import (
    JoinedStreamer,
    Turns,
    group_rows,
    join_sequences,
    only_token_logits,
    run_groups,
    split_call,
)


def test_turns_rotate_in_a_fixed_order_and_skip_a_group_that_left():
    turns, order = Turns(3), []
    steps = {0: 2, 1: 4, 2: 3}  # group 0 ends after 2 steps, 2 after 3, 1 after 4

    def decode(group: int) -> None:
        for step in range(steps[group]):
            turns.acquire(group)
            order.append((group, step))
            turns.release(group)
        turns.leave(group)

    run_groups(decode, 3)
    assert order == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (1, 2), (2, 2), (1, 3)]


def test_turns_refuse_a_release_out_of_turn():
    turns = Turns(2)
    with pytest.raises(RuntimeError, match="group 1 ended a turn that was group 0's"):
        turns.release(1)


def test_a_group_leaving_in_its_turn_hands_it_on():
    turns = Turns(2)
    turns.leave(0)  # (failed before its first step)
    done = threading.Event()

    def second() -> None:
        turns.acquire(1)
        done.set()

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(timeout=5)
    assert done.is_set()


def test_run_groups_raises_a_groups_error():
    def decode(group: int) -> int:
        if group == 1:
            raise ValueError("group 1 failed")
        return group

    with pytest.raises(ValueError, match="group 1 failed"):
        run_groups(decode, 2)


@pytest.mark.parametrize(("rows", "groups", "sizes"), [(8, 2, [4, 4]), (5, 2, [3, 2]), (4, 3, [2, 1, 1])])
def test_group_rows_cover_every_row_once_in_order(rows, groups, sizes):
    parts = group_rows(rows, groups)
    assert [len(p) for p in parts] == sizes
    assert [r for p in parts for r in p] == list(range(rows))


def test_split_call_cuts_the_row_tensors_only():
    ids, mask = torch.arange(12).view(4, 3), torch.ones(4, 3)
    calls = split_call({"input_ids": ids, "attention_mask": mask, "max_new_tokens": 5}, 4, group_rows(4, 2))
    assert [c["input_ids"].tolist() for c in calls] == [ids[:2].tolist(), ids[2:].tolist()]
    assert all(c["max_new_tokens"] == 5 and c["attention_mask"].shape == (2, 3) for c in calls)


def test_join_sequences_pads_a_group_that_ended_first():
    joined = join_sequences([torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, 6, 7, 8]])], pad_token_id=0)
    assert joined.tolist() == [[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]]


def test_only_token_logits_make_every_processor_choose_the_token():
    tokens = torch.tensor([3, 0, 7])
    logits = only_token_logits(tokens, vocab=10, dtype=torch.float32)[:, -1]
    for processor in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(4), TopPLogitsWarper(0.9)):
        scores = processor(None, logits.clone())
        assert scores.argmax(-1).tolist() == tokens.tolist()
        drawn = torch.multinomial(torch.softmax(scores, -1), num_samples=1).squeeze(1)
        assert drawn.tolist() == tokens.tolist()


class _Recorder:
    def __init__(self) -> None:
        self.puts: list[list] = []
        self.ends = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.tolist())

    def end(self) -> None:
        self.ends += 1


def test_joined_streamer_hands_on_whole_steps_in_row_order():
    recorder = _Recorder()
    joined = JoinedStreamer(recorder, groups=2, pad_token_id=0)
    first, second = joined.for_group(0), joined.for_group(1)
    second.put(torch.tensor([[5, 6]]))  # prompts first: handed on once both groups gave theirs
    assert recorder.puts == []
    first.put(torch.tensor([[1, 2], [3, 4]]))
    assert recorder.puts == [[[1, 2], [3, 4], [5, 6]]]
    first.put(torch.tensor([10, 11]))
    first.put(torch.tensor([12, 13]))
    assert len(recorder.puts) == 1  # step 1 waits for group 1's token
    second.put(torch.tensor([20]))
    assert recorder.puts[1:] == [[10, 11, 20]]
    first.end()  # group 0 ended after 2 steps: group 1's third step comes with pads for its rows
    second.put(torch.tensor([21]))
    second.put(torch.tensor([22]))
    assert recorder.puts[2:] == [[12, 13, 21], [0, 0, 22]]
    assert recorder.ends == 0
    second.end()
    assert recorder.ends == 1


def test_groups_join_the_rotation_at_an_agreed_turn():
    """Groups 0 and 1 rotate; group 2 joins at turn 3: it takes its place in the order (after the highest that had a
    turn) from that turn on, wherever the join was said from."""
    turns, order = Turns(2), []
    steps = {0: 4, 1: 4, 2: 2}
    turns.join([2], 3)

    def decode(group: int) -> None:
        for _ in range(steps[group]):
            turns.acquire(group)
            order.append(group)
            turns.release(group)
        turns.leave(group)

    run_groups(decode, 3)
    assert order == [0, 1, 0, 1, 2, 0, 1, 2, 0, 1]


def test_a_join_refuses_a_turn_given_and_a_group_in_the_rotation():
    turns = Turns(2)
    turns.acquire(0)
    assert turns.free_turn() == 1  # turn 0 is held: given
    with pytest.raises(RuntimeError, match="cannot join at turn 0"):
        turns.join([2], 0)
    with pytest.raises(RuntimeError, match="group 1 is in the rotation already"):
        turns.join([1], 4)
    turns.release(0)
    turns.join([2], 1)  # the next turn: group 1's place in the order comes first, then group 2's
    assert turns.free_turn() == 1


def test_no_turn_starts_while_paused():
    turns = Turns(1)
    started = threading.Event()

    def first() -> None:
        turns.acquire(0)
        started.set()

    with turns.paused():
        thread = threading.Thread(target=first)
        thread.start()
        assert not started.wait(timeout=0.2)
    assert started.wait(timeout=5)
    thread.join()


def test_calls_in_lanes_share_them_and_a_call_alone_waits_for_all():
    lanes, log = Lanes(2), []
    with lanes.lane() as first, lanes.lane() as second:
        assert {first, second} == {0, 1}
        alone = threading.Thread(target=lambda: lanes.alone().__enter__() or log.append("alone"))
        alone.start()
        time.sleep(0.1)
        assert log == []  # it waits for both lanes
    alone.join(timeout=5)
    assert log == ["alone"]
