"""Continuous batching of generation requests on a model split over the processes of a `torchrun` job
(`optimum-ipu serve --continuous-batching`, with `tensor_parallel_size` > 1 or the stages of a decoder-only model on
the processes), or whole in one process with `--continuous-batching-engine optimum-ipu`: a request joins the running
batch at the next step and leaves it when done, as `transformers`' managers do for a model whole in one process
(`serving/continuous.py`).

Process 0 decides (this module's `JoinedGeneration`, a `runtime.joined_rows.RowsSchedule`) and every process decodes
(`pipelines.processes.decode_joined_rows`, one call of the job's `Lockstep` that lasts while rows run). Through
stages, the rows decode in one group per stage, in flight (stage 0 computes one group's step while stage 1 computes
the other's); a request joins the group whose pass comes first with room in it (each holds up to its share of
`--max-batch-size`, and no more than an even part of the rows decoding or waiting). Before each pass of a group the
schedule ends its rows that are done (the end-of-sequence token, `max_tokens`, a stop string, a client gone) and lets
waiting requests join; the call ends once no row runs and none waits, and the next request starts another. Another
call of the job (a request of several choices or with a seed, batched statically, alone or through stages in a lane)
that waits for the processes stops the joining: the running rows finish, that call runs, then the joining resumes.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import logging
import random
import threading
import time
from collections import deque
from typing import Any

from ..pipelines.processes import RowsControl, RowsSchedule, causal_model, decode_joined_rows, why_rows_cannot_join
from .generation import Choice, GenerationSink, cut_at_stop, eos_token_ids, new_text, prompt_ids

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Request:
    """A request's future (in the event loop) and its sink; `pending` choices not yet done."""

    future: asyncio.Future
    sink: GenerationSink
    pending: int


@dataclasses.dataclass
class _Row:
    """One choice of a request decoding as a row: its prompt, `max_tokens`, sampling and stop strings."""

    request: _Request
    index: int
    prompt: list[int]
    max_new_tokens: int
    sampling: tuple[float, float]
    stop: list[str]
    done: bool = False


class JoinedGeneration(RowsSchedule):
    """Continuous batching across the processes of a model split over them (see the module docstring).

    Args:
        pipe: the served `text-generation` pipeline (process 0's `LeadingPipeline`, or one process's pipeline).
        max_batch_size (`int`, *optional*, defaults to 8): rows decoding at once.
    """

    def __init__(self, pipe: Any, max_batch_size: int = 8) -> None:
        self.check(pipe)
        self.pipe, self.max_batch_size = pipe, max_batch_size
        self.model = causal_model(pipe)
        self.eos = eos_token_ids(pipe)
        self.tokenizer = copy.deepcopy(pipe.tokenizer)  # (decoding texts in the decoding thread)
        self.waiting: deque[_Row] = deque()
        self.running: list[list[_Row]] = [[]]  # each group's rows (`begin`)
        self.share = max_batch_size  # the rows a group may hold
        self.closing = False  # a group was told the decoding is finished: the others are told too
        self.in_flight = 0
        self._lock = threading.Lock()  # (the groups' threads, and the event loop's `submit`)
        self._thread: threading.Thread | None = None

    @staticmethod
    def check(pipe: Any) -> None:
        """One line when this cannot serve `pipe`: another task, a model whose stages are on separate processes, or one
        whose KV cache keeps a sliding window."""
        if getattr(pipe, "task", None) != "text-generation":
            raise ValueError(
                f"--continuous-batching: batches generation requests; this server's task is {pipe.task}: leave it out"
            )
        why = why_rows_cannot_join(pipe)
        if why is not None:
            raise ValueError(f"--continuous-batching: {why}")

    def start(self) -> None:
        """Nothing to start: the decoding runs while requests do."""

    def stop(self) -> None:
        """Wait for the decoding to end (the requests in flight have finished once the server drained)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout=30)

    def takes(self, kwargs: dict[str, Any]) -> bool:
        """Whether a request of these pipeline arguments runs here: one choice, no seed."""
        return kwargs.get("num_return_sequences", 1) == 1 and "seed" not in kwargs

    def submit(self, sink: GenerationSink, prompts: list[Any], kwargs: dict[str, Any], param: str) -> asyncio.Future:
        """Queue one row per prompt; the future of `sink` once every choice has ended (cancelling it ends its rows at
        the next step). Raises the pipeline's `InputError` for a prompt it refuses."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        prompts_ids = [prompt_ids(self.pipe, prompt, param) for prompt in prompts]
        sink.prompt_tokens = sum(len(ids) for ids in prompts_ids)
        sink.choices = [Choice() for _ in prompts_ids]
        request = _Request(future, sink, len(prompts_ids))
        sampled = bool(kwargs.get("do_sample"))
        sampling = (float(kwargs["temperature"]), float(kwargs.get("top_p", 1.0))) if sampled else (0.0, 1.0)
        stop = list(kwargs.get("stop_sequence", []))
        rows = [_Row(request, i, ids, kwargs["max_new_tokens"], sampling, stop) for i, ids in enumerate(prompts_ids)]
        self.in_flight += 1
        future.add_done_callback(functools.partial(self._done, sink))
        with self._lock:
            self.waiting.extend(rows)
            if self._thread is None:
                self._thread = threading.Thread(target=self._decode, name="optimum-ipu-joined-rows", daemon=True)
                self._thread.start()
        return future

    def rows(self) -> tuple[int, int]:
        """The rows decoding and those waiting to join (`/metrics`)."""
        with self._lock:
            return sum(len(group) for group in self.running), len(self.waiting)

    def _done(self, sink: GenerationSink, future: asyncio.Future) -> None:
        self.in_flight -= 1
        if future.cancelled():  # (a timeout, a client gone): its rows end at the next step, or never join
            sink.cancel()

    def _decode(self) -> None:
        """The decoding thread: one decoding call while rows run or wait, again while requests keep coming."""
        while True:
            try:
                seed = random.getrandbits(63)
                if hasattr(self.pipe, "decode_joined_rows"):  # the processes of a torchrun job
                    while self._others_wait(running=0):  # a call that waited for these rows goes first
                        time.sleep(0.001)
                    self.pipe.decode_joined_rows(seed, self)
                else:
                    decode_joined_rows(self.pipe, seed, self)
            except Exception as err:  # the requests in flight get it; the next request starts afresh
                logger.error("continuous batching failed: %s", err)
                self._fail(err)
            with self._lock:
                if not self.waiting:
                    self._thread = None
                    return

    def _fail(self, err: Exception) -> None:
        with self._lock:
            rows = [*(row for group in self.running for row in group), *self.waiting]
            self.running = [[] for _ in self.running]
            self.waiting.clear()
        for request in {id(row.request): row.request for row in rows}.values():
            future = request.future
            future.get_loop().call_soon_threadsafe(_set_exception, future, err)

    def begin(self, groups: int) -> None:
        """A decoding call starts with `groups` groups of rows, each holding up to its share of `max_batch_size`."""
        with self._lock:
            self.running = [[] for _ in range(groups)]
            self.share = -(-self.max_batch_size // groups)
            self.closing = False

    def control(self, rows: int, group: int) -> RowsControl:
        """`group`'s rows that end (done, or their client gone) and those that join, up to its share of
        `max_batch_size` and an even part of the rows decoding or waiting; none join while another call waits for the
        processes (the running rows finish first). The decoding finishes once no group has a row and none waits (or
        another call does); every group is told so."""
        with self._lock:
            running = self.running[group]
            for row in running:
                row.done = row.done or row.request.sink.cancelled
            ends = [i for i, row in enumerate(running) if row.done]
            running[:] = [row for row in running if not row.done]
            joins: list[_Row] = []
            others_wait = self._others_wait(running=1)
            decoding = sum(len(g) for g in self.running)
            # each group up to its share, and no more than an even part of the rows decoding or waiting: one request
            # of several prompts, or a few arriving at once, fill every group's turns, not the first group's only
            even = -(-(decoding + len(self.waiting)) // len(self.running))
            room = min(min(self.share, even) - len(running), self.max_batch_size - decoding)
            while self.waiting and len(joins) < room and not others_wait and not self.closing:
                row = self.waiting.popleft()
                if not row.request.sink.cancelled:
                    joins.append(row)
            running += joins
            # (requests left waiting for another call start the next decoding call, once that call has run)
            self.closing = self.closing or not any(self.running) and (not self.waiting or others_wait)
            return RowsControl(ends, [row.prompt for row in joins], [row.sampling for row in joins], self.closing)

    def _others_wait(self, running: int) -> bool:
        """Whether other calls of the job wait for the processes (`running`: this schedule's own call alone, 1 while
        it decodes): a call alone (a seeded or several-choice request), or a call in a lane (a several-choice request
        through stages); the joining stops for them."""
        lanes = getattr(getattr(self.pipe, "lockstep", None), "lanes", None)
        return lanes is not None and (lanes.calls_alone > running or lanes.calls_waiting_for_a_lane > 0)

    def tokens(self, joined: list[int] | None, stepped: list[int] | None, group: int) -> None:
        """A pass's tokens to `group`'s rows: `joined` for the rows that just joined (the last ones), `stepped` for
        every row."""
        with self._lock:
            running = self.running[group]
            rows = running[len(running) - len(joined) :] if joined is not None else running
            for row, token in zip(rows, joined if joined is not None else stepped or [], strict=True):
                if not row.done:
                    self._add(row, token)

    def _add(self, row: _Row, token: int) -> None:
        sink = row.request.sink
        choice = sink.choices[row.index]
        choice.ids.append(token)
        choice.ended = token in self.eos
        if sink.queue is not None:
            sink.loop.call_soon_threadsafe(sink.queue.put_nowait, (row.index, token))
        stopped = False
        if row.stop:
            choice.text = new_text(self.tokenizer, choice.ids)
            stopped = cut_at_stop(choice.text, row.stop)[1]
        if not (choice.ended or stopped or len(choice.ids) >= row.max_new_tokens):
            return
        row.done = True
        choice.text = new_text(self.tokenizer, choice.ids)
        row.request.pending -= 1
        if row.request.pending == 0:
            future = row.request.future
            future.get_loop().call_soon_threadsafe(_set_result, future, sink)


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, err: Exception) -> None:
    if not future.done():
        future.set_exception(err)
