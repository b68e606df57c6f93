"""Calls that every process of a `torchrun` job makes together, led by process 0.

A model whose stages run on separate processes answers a call only when every process of its replica runs it with the
same inputs (each forward goes through every stage). A server holds its socket in one process: `Lockstep` lets process
0 lead, sending each call's inputs to the others before it makes the call itself, while the others follow: they wait
for the next call, make it, and so on until process 0 says stop. A call's inputs travel as one small message (the
request); what the model computes travels as tensors, between stages.

A follower that receives nothing within the job's collective timeout raises (the leader died or stopped without
saying so); a follower ignores SIGTERM, which `torchrun` sends every process, so that a draining leader finishes the
calls in flight with it and then releases it.

What only the leader knows while a call runs (which requests' clients have gone) reaches the other processes through
`LeaderStop`, a stopping criterion of `generate()`: its rows end on every stage at the same step.

Calls in lanes (`lead(..., overlap=True)`): a generation call may run while others decode, each in a lane of its own
(at most `lanes`), on the leader in the caller's thread and on a follower in a thread of its own; a call that does
not overlap waits until no lane is busy, and runs alone. Within a process, the calls' host work (tokenizing, padding,
decoding text) runs one at a time (`host_lock`), and a call in a lane lets the others have it while its model decodes
(`others_may_run`); what keeps their decoding in step is the stages' own rotation of turns (`stages.groups.Turns`).
A call in a lane carries no random state: the calls' sampling draws from each process's own generator.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from transformers.generation.stopping_criteria import StoppingCriteria

from .host_collectives import registered

logger = logging.getLogger(__name__)

_CALL, _STOP = "call", "stop"
LANES = 2  # generation calls of a server that may decode at once (`Lockstep(lanes=...)` by default)

host_lock = threading.Lock()  # a process's calls do their host work one at a time (the module docstring)
_call = threading.local()  # the lane of the call this thread runs (`current_lane`)


def current_lane() -> int | None:
    """The lane of the call this thread runs (`Lockstep.lead(..., overlap=True)`), or None: a call alone."""
    return getattr(_call, "lane", None)


@contextmanager
def others_may_run() -> Iterator[None]:
    """Within a call in a lane: the process's other calls may do their host work meanwhile (this call's model
    decodes); nothing outside a lane (a call alone keeps the process)."""
    if current_lane() is None:
        yield
        return
    host_lock.release()
    try:
        yield
    finally:
        host_lock.acquire()


def _run_call(fn: Callable[..., Any], lane: int | None, args: tuple, kwargs: dict[str, Any]) -> Any:
    """`fn(*args, **kwargs)` as a call of `lane` (None: alone), its host work holding `host_lock`."""
    _call.lane = lane
    try:
        with host_lock:
            return fn(*args, **kwargs)
    finally:
        _call.lane = None


class Lanes:
    """The leader's lanes: a call in a lane takes a free one; a call alone waits until every lane is free and keeps
    them all (and calls in lanes wait while one waits to run alone, so that it is not starved).

    Args:
        count (`int`): the lanes.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._free = list(range(count))
        self._alone = 0  # calls alone running or waiting to
        self._waiting = 0  # calls in lanes waiting for one
        self._changed = threading.Condition()

    @contextmanager
    def lane(self) -> Iterator[int]:
        with self._changed:
            self._waiting += 1
            self._changed.wait_for(lambda: self._free and not self._alone)
            self._waiting -= 1
            lane = self._free.pop(0)
        try:
            yield lane
        finally:
            with self._changed:
                self._free.append(lane)
                self._free.sort()
                self._changed.notify_all()

    @property
    def calls_alone(self) -> int:
        """Calls alone running or waiting to (a long call alone may end early for those that wait)."""
        return self._alone

    @property
    def calls_waiting_for_a_lane(self) -> int:
        """Calls in lanes waiting for one (a call alone that runs while they wait may end early for them)."""
        return self._waiting

    @contextmanager
    def alone(self) -> Iterator[None]:
        with self._changed:
            self._alone += 1
            self._changed.wait_for(lambda: len(self._free) == self.count)
            self._free.clear()
        try:
            yield
        finally:
            with self._changed:
                self._alone -= 1
                self._free = list(range(self.count))
                self._changed.notify_all()


def leads() -> bool:
    """Whether this process leads the job's calls (process 0, or the only one)."""
    return not dist.is_initialized() or dist.get_rank() == 0


class Lockstep:
    """Runs `fn` on every process of the job with the leader's arguments (see the module docstring).

    Args:
        fn (`Callable`): what every process calls; on the followers its result is dropped.
        lanes (`int`, *optional*, defaults to `LANES`): calls that may run at once (`lead(..., overlap=True)`).
        targets (`dict[str, Callable]`, *optional*): other functions a call may name (`lead(..., target=name)`),
            each process's own (bound to its model, say).
    """

    def __init__(
        self, fn: Callable[..., Any], lanes: int = LANES, targets: dict[str, Callable[..., Any]] | None = None
    ) -> None:
        self.fn = fn
        self.targets = dict(targets or {})
        self.stopped = False
        self.lanes = Lanes(lanes)
        self._sending = threading.Lock()  # the leader's calls send their messages one at a time

    def lead(
        self,
        args: tuple,
        kwargs: dict[str, Any],
        local: dict[str, Any] | None = None,
        overlap: bool = False,
        target: str | None = None,
    ) -> Any:
        """On the leader: send `args` and `kwargs` (and, for a call alone, this process's random state, so that
        sampling draws alike wherever it happens) to every follower, then call `fn(*args, **kwargs, **local)` here;
        `local` (a streamer, say) stays in this process. With `overlap`, the call runs in a lane, beside others.
        With `target`, each process calls its function of that name (`targets`) instead of `fn`."""
        kwargs_here = {**kwargs, **(local or {})}
        fn = self._function(target)
        if overlap:
            with self.lanes.lane() as lane:
                self._send((_CALL, args, kwargs, None, lane, target))
                return _run_call(fn, lane, args, kwargs_here)
        with self.lanes.alone():
            self._send((_CALL, args, kwargs, torch.get_rng_state(), None, target))
            return _run_call(fn, None, args, kwargs_here)

    def _function(self, target: str | None) -> Callable[..., Any]:
        """What a call of `target` runs in this process: `fn`, or the target of that name."""
        return self.fn if target is None else self.targets[target]

    def _send(self, message: tuple) -> None:
        with self._sending:
            dist.broadcast_object_list([message], src=0)

    def stop(self) -> None:
        """On the leader: release the followers (they return from `follow`). Once; nothing after it."""
        if not self.stopped:
            self.stopped = True
            self._send((_STOP, (), {}, None, None, None))

    def follow(self) -> None:
        """On a follower: make each call the leader sends, until it says stop: a call alone here, once the calls in
        lanes have ended; a call in a lane in a thread of its own. A call that raises is logged (the leader, given the
        same inputs, raises the same error and answers it)."""
        previous = signal.signal(signal.SIGTERM, _ignore_sigterm)
        in_lanes: list[threading.Thread] = []
        try:
            while True:
                message: list[Any] = [None]
                dist.broadcast_object_list(message, src=0)
                kind, args, kwargs, random_state, lane, target = message[0]
                fn = self._function(target)
                in_lanes = [thread for thread in in_lanes if thread.is_alive()]
                if kind == _STOP:
                    return
                if lane is not None:
                    thread = threading.Thread(
                        target=self._follow_call, args=(fn, lane, args, kwargs), name=f"optimum-ipu-lane-{lane}"
                    )
                    thread.start()
                    in_lanes.append(thread)
                    continue
                for thread in in_lanes:
                    thread.join()
                torch.set_rng_state(random_state)
                self._follow_call(fn, None, args, kwargs)
        finally:
            for thread in in_lanes:
                thread.join()
            signal.signal(signal.SIGTERM, previous)

    def _follow_call(self, fn: Callable[..., Any], lane: int | None, args: tuple, kwargs: dict[str, Any]) -> None:
        try:
            _run_call(fn, lane, args, kwargs)
        except Exception as error:  # the leader answers it; the stages must stay in step for the next call
            logger.info("a call failed here as on the leading process: %s", error)


class LeaderStop(StoppingCriteria):
    """A stopping criterion decided by the leading process, for rows whose end only it knows (a request whose client
    went away): each decoding step, the rows `rows_done` names end, and where the call runs on several processes (the
    model's stages, or its split layers, on each) they end on every process at the same step (the processes' masks
    are reduced: a step's one small collective), so that every decoding loop stops together.

    It travels with a call's arguments (`Lockstep.lead` pickles them) without `rows_done`, which stays on the leader:
    a follower's copy ends nothing itself and takes the leader's mask. Generation across stages binds it to the
    group of processes that decode its rows (`bound`); unbound, it agrees over every process of the job (each runs
    the call, as `Lockstep` makes them), and in one process it is `rows_done` alone.

    Args:
        rows_done (`Callable[[int], Sequence[bool]]`, *optional*): on the leader, for the `rows` rows of the whole
            `generate()` call (prompts x `num_return_sequences`), whether each is to end now; `None` elsewhere.
    """

    def __init__(self, rows_done: Callable[[int], Sequence[bool]] | None = None) -> None:
        self.rows_done = rows_done
        self.group: Any = None  # the process group of the stages that decode these rows (None: no collective)
        self.part: range | None = None  # the call's prompts whose rows this copy decides (None: all of them)
        self.prompts = 0  # the whole call's prompts (with `part`)

    def __reduce__(self) -> tuple:  # (what a follower receives: no `rows_done`, no binding)
        return (LeaderStop, ())

    def bound(self, group: Any, part: range | None = None, prompts: int = 0) -> LeaderStop:
        """A copy that decides the rows of prompts `part` (of the call's `prompts`; None: every row) with the
        processes of `group` (`torch.distributed` process group)."""
        copied = LeaderStop(self.rows_done)  # (not copy.copy: it would pickle, and leave `rows_done` behind)
        copied.group, copied.part, copied.prompts = group, part, prompts
        return copied

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        rows = input_ids.shape[0]
        done = torch.zeros(rows, dtype=torch.uint8, device=input_ids.device)
        if self.rows_done is not None:
            if self.part is None:
                flags = list(self.rows_done(rows))
            else:  # this copy's rows of the whole call: `n` rows a prompt, in prompt order
                n = rows // max(len(self.part), 1)
                flags = list(self.rows_done(self.prompts * n))[self.part.start * n : self.part.stop * n]
            done = torch.tensor(flags, dtype=torch.uint8, device=input_ids.device)
        group = self.group
        if group is None and dist.is_initialized() and dist.get_world_size() > 1:
            group = dist.group.WORLD  # unbound under torchrun: every process of the job runs this call (`Lockstep`)
        shared = registered(group) if group is not None else None
        if shared is not None:  # the processes of a split model: through its shared memory, not a gloo round trip
            shared.all_reduce(done)  # (a sum of 0/1 flags: nonzero where any process ends the row, as MAX)
        elif group is not None:
            dist.all_reduce(done, op=dist.ReduceOp.MAX, group=group)
        return done.bool()


def _ignore_sigterm(signum: int, frame: Any) -> None:
    logger.info("SIGTERM: this process follows process 0, which drains the server and then releases it")
