"""Generation through stages with several groups of sequences in flight, so that every stage decodes at each moment.

One `generate()` call over a batch decodes token by token: the stages of one sequence run in turn, so with the whole
batch in one group, stage 0 waits while stage 1 computes, and the reverse. Here the batch's rows are cut into as many
groups as there are stages, each decoded by the stock `generate()` in its own thread, on its own KV cache and its own
process group (the replica's stages, once per group): while stage 1 computes group A's token, stage 0 computes group
B's, the scheme of vLLM's pipeline-parallel engines.

What travels per token: the hidden states between stages (a tensor, its shape header first), and the chosen token ids
from the last stage to the others (one `int64` tensor of the group's rows, broadcast in the group); never logits. The
last stage's `generate()` chooses the tokens (greedy or sampled, its logits processors, its stopping criteria); a
stopping criterion of ours, called by that loop right after the choice, sends them. On the other stages, the model
call returns logits that allow only the received token (0 there, minus infinity elsewhere), so their `generate()`
loops choose the same tokens and stop at the same step, whatever the processors and sampling do.

A process computes one group at a time, in a fixed rotation (`Turns`): stage forwards swap modules of the one shared
model, and the last stage's draws of a sampled generation then come in the same order at every run, so a seed gives
the same tokens. A `LeaderStop` among the stopping criteria (the leading process's rows of gone requests) is bound to
each group's processes and rows: a row it ends ends on every stage at the same step. The groups' outputs are joined as
one `generate()` returns them: the same rows, in order, each padded with the pad token after its end (greedy tokens
equal those of one process; `tests/distributed`).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from ..joined_rows import JoinedRows
from ..lockstep import LeaderStop


class Turns:
    """Which group may compute on this process now: the groups in a fixed rotation (ascending numbers, cyclically), a
    group leaving it when its decoding ends (on every process at the same step, since every process sees the same
    tokens), and joining it at a turn every process of the replica agreed on (`join_rotation`). Every process then
    gives the same turns in the same order: stage i + 1's turn k is the step whose hidden states stage i sent in its
    turn k.

    A turn is given to the group after the last one to end a turn (the first after the highest); a group that is next
    but has not left yet (it waits for its last tokens) keeps the turn until it leaves, so a process never gives away
    a turn the others give to that group.

    Args:
        groups (`int`, *optional*, defaults to 0): the groups numbered 0 to `groups - 1`, in the rotation from the
            start.
    """

    def __init__(self, groups: int = 0) -> None:
        self._active: list[int] = list(range(groups))  # in the rotation, ascending
        self._joining: dict[int, int] = {}  # group -> the number of the first turn it may take
        self._count = 0  # turns ended on this process
        self._last: int | None = None  # the group whose turn ended last
        self._holder: int | None = None  # the group computing now
        self._paused = 0
        self._changed = threading.Condition()

    def _next(self) -> int | None:
        """The group whose turn is next (its joins at this turn count applied); None when no group is in it."""
        for group, turn in list(self._joining.items()):
            if turn <= self._count:
                del self._joining[group]
                bisect.insort(self._active, group)
        if not self._active:
            return None
        if self._last is None:
            return self._active[0]
        return next((g for g in self._active if g > self._last), self._active[0])

    def acquire(self, group: int) -> None:
        """Wait for `group`'s turn (and for no agreement on joins to be under way here: `paused`)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._paused and self._holder is None and self._next() == group)
            self._holder = group

    def release(self, group: int) -> None:
        """End `group`'s turn: the next group in the rotation may compute."""
        with self._changed:
            if self._holder != group:
                whose = self._holder if self._holder is not None else self._next()
                raise RuntimeError(f"group {group} ended a turn that was group {whose}'s")
            self._holder, self._last = None, group
            self._count += 1
            self._changed.notify_all()

    def leave(self, group: int) -> None:
        """Take `group` out of the rotation (its decoding ended, or failed)."""
        with self._changed:
            if self._holder == group:  # (failed within its turn: the turn ends with it)
                self._holder, self._last = None, group
                self._count += 1
            if group in self._active:
                self._active.remove(group)
            self._joining.pop(group, None)
            self._changed.notify_all()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Within it, no turn starts on this process (one under way goes on): what `free_turn` says stays true."""
        with self._changed:
            self._paused += 1
        try:
            yield
        finally:
            with self._changed:
                self._paused -= 1
                self._changed.notify_all()

    def free_turn(self) -> int:
        """The number of the first turn this process has not given yet (turns are numbered from 0)."""
        with self._changed:  # (a reentrant lock: `join` asks within it)
            return self._count + (self._holder is not None)

    def join(self, groups: Sequence[int], turn: int) -> None:
        """Put `groups` in the rotation from turn number `turn` on (one this process has not given yet)."""
        with self._changed:
            if turn < self.free_turn():
                raise RuntimeError(f"groups {list(groups)} cannot join at turn {turn}: this process gave it already")
            for group in groups:
                if group in self._active or group in self._joining:
                    raise RuntimeError(f"group {group} is in the rotation already")
                self._joining[group] = turn
            self._changed.notify_all()


def join_rotation(turns: Turns, groups: Sequence[int], group: Any) -> None:
    """Put `groups` (a new call's, decoded by the processes of `group`) into `turns` on every one of those processes
    at the same turn, while other calls' groups decode.

    The processes first meet (so that none stops giving turns while another still needs them to finish a previous
    call), then each, its rotation paused, says the first turn it has not given; the largest is the join's turn: no
    process has given it, so every one gives it, and the turns after it, alike."""
    dist.barrier(group=group)
    with turns.paused():
        free = torch.tensor([turns.free_turn()], dtype=torch.long)
        dist.all_reduce(free, op=dist.ReduceOp.MAX, group=group)
        turns.join(groups, int(free))


class SendTokens(StoppingCriteria):
    """The last stage's part of each decoding step, run by its `generate()` loop right after it chose the tokens:
    broadcast them to the group's other stages, then end this process's turn. Never stops anything itself."""

    def __init__(self, group: Any, src: int, turns: Turns, index: int) -> None:
        self.group, self.src, self.turns, self.index = group, src, turns, index
        self.holding = False  # whether this group's turn is held (from the step's forward until here)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        self.send(input_ids[:, -1])
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def send(self, tokens: torch.Tensor) -> None:
        """Broadcast a step's chosen `tokens` (one a row) to the group's other stages, and end this turn."""
        dist.broadcast(tokens.contiguous(), src=self.src, group=self.group)
        self.holding = False
        self.turns.release(self.index)


class StageRows(JoinedRows):
    """One group's rows of continuous batching through stages (`runtime.joined_rows`), on this process's stage: the
    last stage chooses each step's tokens and sends them to the group's other stages (ending its turn, `send`); on
    the others the model call's logits allow only those tokens (`only_token_logits`), which the argmax takes.

    Args:
        model (`nn.Module`): the stock model holding this stage, its forward replaced while generating
            (`StageGeneration.generating`).
        seed (`int`): the sampling generator's seed (the last stage's draws are the group's).
        send (`SendTokens`, *optional*): on the last stage, what sends the tokens; None on the others.
    """

    def __init__(self, model: Any, seed: int, send: SendTokens | None) -> None:
        super().__init__(model, seed)
        self.send = send

    def _choose(self, logits: torch.Tensor, sampling: list[tuple[float, float]]) -> torch.Tensor:
        if self.send is None:
            return logits.argmax(-1)
        tokens = super()._choose(logits, sampling)
        self.send.send(tokens)
        return tokens


def only_token_logits(tokens: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Logits of shape `(rows, 1, vocab)` that allow only `tokens` (0 there, minus infinity elsewhere): greedy search,
    sampling and every logits processor of `generate()` then choose those tokens."""
    logits = torch.full((tokens.shape[0], 1, vocab), float("-inf"), dtype=dtype, device=tokens.device)
    return logits.scatter_(2, tokens.view(-1, 1, 1), 0.0)


def group_rows(rows: int, groups: int) -> list[range]:
    """The rows of each group: `rows` cut into `groups` consecutive parts, as even as can be (the first larger)."""
    bounds = [rows * g // groups for g in range(groups + 1)]
    sizes = sorted((bounds[g + 1] - bounds[g] for g in range(groups)), reverse=True)
    starts = [sum(sizes[:g]) for g in range(groups)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def split_call(kwargs: dict[str, Any], rows: int, parts: list[range]) -> list[dict[str, Any]]:
    """`generate()`'s arguments for each group: its rows of every tensor with a row per prompt, the rest shared."""
    calls = []
    for part in parts:
        call = dict(kwargs)
        for key, value in kwargs.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == rows:
                call[key] = value[part.start : part.stop]
        calls.append(call)
    return calls


def join_sequences(outputs: list[torch.Tensor], pad_token_id: int) -> torch.Tensor:
    """The groups' generated ids as one batch: each padded after its end with `pad_token_id` to the longest."""
    length = max(o.shape[1] for o in outputs)
    padded = [torch.nn.functional.pad(o, (0, length - o.shape[1]), value=pad_token_id) for o in outputs]
    return torch.cat(padded)


class JoinedStreamer(BaseStreamer):
    """One streamer of the whole batch over the groups' `generate()` calls: each step's tokens are handed on once
    every group still decoding has put its own, in row order; a group that ended gives pad tokens.

    Args:
        streamer (`BaseStreamer`): the streamer `generate()` was given for the whole batch.
        groups (`int`): the groups (each calls `put` and `end` on its view, `for_group(g)`).
        pad_token_id (`int`): the token of an ended group's rows.
    """

    def __init__(self, streamer: BaseStreamer, groups: int, pad_token_id: int) -> None:
        self.streamer, self.pad_token_id = streamer, pad_token_id
        self._prompts: list[torch.Tensor | None] = [None] * groups
        self._tokens: list[list[torch.Tensor]] = [[] for _ in range(groups)]
        self._widths = [0] * groups
        self._ended = [False] * groups
        self._lock = threading.Lock()

    def for_group(self, group: int) -> BaseStreamer:
        """The streamer group `group`'s `generate()` is given."""
        return _GroupStreamer(self, group)

    def put_from(self, group: int, value: torch.Tensor) -> None:
        with self._lock:
            if self._prompts[group] is None:  # generate()'s first put: the group's prompts
                self._prompts[group] = value
                if all(p is not None for p in self._prompts):
                    self.streamer.put(torch.cat(self._prompts))
                return
            self._widths[group] = value.shape[0]
            self._tokens[group].append(value)
            self._hand_on()

    def end_from(self, group: int) -> None:
        with self._lock:
            self._ended[group] = True
            self._hand_on()
            if all(self._ended):
                self.streamer.end()

    def _hand_on(self) -> None:
        """Hand on every step that each group has put or ended before."""
        while any(self._tokens) and all(t or ended for t, ended in zip(self._tokens, self._ended, strict=True)):
            step = [
                tokens.pop(0) if tokens else torch.full((width,), self.pad_token_id, dtype=torch.long)
                for tokens, width in zip(self._tokens, self._widths, strict=True)
            ]
            self.streamer.put(torch.cat(step))


class _GroupStreamer(BaseStreamer):
    def __init__(self, joined: JoinedStreamer, group: int) -> None:
        self.joined, self.group = joined, group

    def put(self, value: torch.Tensor) -> None:
        self.joined.put_from(self.group, value)

    def end(self) -> None:
        self.joined.end_from(self.group)


def run_groups(decode: Callable[[int], Any], groups: int) -> list[Any]:
    """`decode(g)` for every group, each in its own thread; their results in group order (the first error raised)."""
    results: list[Any] = [None] * groups
    errors: list[BaseException] = []

    def run(group: int) -> None:
        try:
            results[group] = decode(group)
        except BaseException as error:  # noqa: BLE001 (raised again in the calling thread)
            errors.append(error)

    threads = [threading.Thread(target=run, args=(g,), name=f"optimum-ipu-group-{g}") for g in range(groups)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def with_criterion(kwargs: dict[str, Any], criterion: StoppingCriteria) -> dict[str, Any]:
    """`kwargs` with `criterion` before the caller's own stopping criteria: the last stage sends a step's tokens
    before any `LeaderStop` reduces its mask, the order in which the other stages, which receive the tokens within
    the model call, reach them."""
    own = kwargs.get("stopping_criteria") or []
    return {**kwargs, "stopping_criteria": StoppingCriteriaList([criterion, *own])}


def bind_leader_stops(kwargs: dict[str, Any], group: Any, part: range | None = None, prompts: int = 0) -> dict:
    """`kwargs` with each `LeaderStop` among its stopping criteria bound to `group` and the prompts `part` of the
    call's `prompts` (`LeaderStop.bound`); `kwargs` itself when it has none."""
    own = kwargs.get("stopping_criteria") or []
    if not any(isinstance(c, LeaderStop) for c in own):
        return kwargs
    bound = [c.bound(group, part, prompts) if isinstance(c, LeaderStop) else c for c in own]
    return {**kwargs, "stopping_criteria": StoppingCriteriaList(bound)}
