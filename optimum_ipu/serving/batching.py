"""Requests batched by arrival: the requests that arrive together, with the same call settings, run as one call.

A request becomes a `Job`: its inputs (one or several), a key saying which requests it may run with (the endpoint
and every setting of the call: two completions with different temperatures cannot share a `generate()` call), and
the function that runs a batch of jobs. One asyncio task gathers jobs: a batch opens at the oldest waiting job and
closes when its compatible jobs hold `max_batch_size` inputs or its wait is over; it then runs in the one worker
thread, so the event loop keeps answering (health checks, metrics, new requests) while the model computes. While it
computes, new requests queue, and the next batch takes them at once: the busier the server, the larger its batches.
The wait is `batch_wait_s` at most, and never more than a tenth of what the key's previous batch took to compute
(`WAIT_SHARE`): waiting for company costs a lone client at most 10% of its latency, so a 8 ms question-answering call
waits 0.8 ms, while a generation of a second or more waits the whole `batch_wait_s` for the requests of a burst. A
lone client of a fast call waits not at all: when the key's previous batch was one job with none arriving while it
computed, this job arrived within that compute time of its end (a client that sends its next request once answered)
and is the only one waiting, and a tenth of the compute time is below `batch_wait_s` (a call of under ten times
`batch_wait_s`: a companion that misses the batch then waits one such call, never a generation). Measured on
question answering at concurrency 1, the wait had cost about 1.2 ms of the server's 2.9 ms over `pipeline()`. A
wait for as many requests as the previous batch held would cost nothing at concurrency 1, but after a quiet spell it
runs a burst's first generation alone, and the rest wait for it to end (measured: concurrency 32 fell to 0.65x of
`transformers serve --continuous-batching`). The queue is bounded: past `max_queue` waiting jobs, `QueueFull` (the
app answers 429). A job whose future is cancelled (its client timed out or went away) leaves the queue at once,
freeing its place.

Under `torchrun`, where a text-generation model's stages decode several batches at once (`batches_in_flight`), a
batch of jobs that may overlap (`Job.overlaps`: generation without a seed) starts while others of the kind compute,
up to `batches_in_flight` of them, each in a worker thread of its own; any other batch starts once nothing computes,
and nothing starts beside it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .metrics import ServerMetrics

logger = logging.getLogger(__name__)

WAIT_SHARE = 0.1  # a batch waits for company at most this share of its key's previous compute time
KEYS_TIMED = 256  # keys whose last compute time is kept (the most recent: keys hold every setting of a call)


class QueueFull(Exception):
    """The queue holds `max_queue` waiting requests."""


@dataclass(eq=False)
class Job:
    """One request waiting for, or running in, a batch.

    Args:
        key: jobs with equal keys may run in one call (the endpoint and the call's settings).
        items (`list`): the request's inputs, in order.
        run: runs a batch of jobs of this key in the worker thread; returns one result (or exception) per job.
        kwargs (`dict`): the call's settings, the same for every job of the key.
        context: what `run` needs beside the inputs (a streaming sink, ...).
        on_cancel: called (in the event loop) when the job's future is cancelled: its client timed out or went
            away; a computation running it may stop early (generation ends the request's rows).
        arrived (`float`): when the request came (`time.monotonic()`; by default, when the job is made).
        overlaps (`bool`): its batch may compute beside other such batches (`Batcher(batches_in_flight=...)`).
    """

    key: Hashable
    items: list[Any]
    run: Callable[[list[Job]], list[Any]]
    kwargs: dict[str, Any] = field(default_factory=dict)
    context: Any = None
    future: asyncio.Future | None = None
    on_cancel: Callable[[], None] | None = None
    arrived: float = field(default_factory=time.monotonic)  # (`time.monotonic()`: asyncio's loop clock too)
    overlaps: bool = False


class Batcher:
    """Gathers jobs into batches and runs them one at a time in a worker thread (see the module docstring).

    Args:
        max_batch_size (`int`): inputs of one batch at most (a single job with more runs alone, the pipeline
            splitting it into host batches).
        batch_wait_s (`float`): how long a batch stays open for more jobs after its first.
        max_queue (`int`): waiting jobs at most.
        metrics (`ServerMetrics`): where the batch sizes, call times and queue depth go.
        task (`str`): the label of the batch metrics.
        batches_in_flight (`int`, *optional*, defaults to 1): batches of jobs that overlap computing at once.
    """

    def __init__(
        self,
        max_batch_size: int,
        batch_wait_s: float,
        max_queue: int,
        metrics: ServerMetrics,
        task: str,
        batches_in_flight: int = 1,
    ) -> None:
        self.max_batch_size, self.batch_wait_s, self.max_queue = max_batch_size, batch_wait_s, max_queue
        self.metrics, self.task = metrics, task
        self._waiting: deque[Job] = deque()
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        # a thread per batch in flight: one, unless batches overlap (the model's own operators use the cores)
        self.batches_in_flight = batches_in_flight
        self._executor = ThreadPoolExecutor(max_workers=batches_in_flight, thread_name_prefix="optimum-ipu-pipeline")
        self._computing: dict[asyncio.Task, bool] = {}  # the batches computing, and whether each overlaps
        self.running = 0  # jobs in the batches being computed
        # each key's previous batch: its compute time (which bounds the wait), and when it ended if it was one job
        # with none arriving meanwhile (a lone client's)
        self._previous_batch: dict[Hashable, tuple[float, float | None]] = {}

    @property
    def depth(self) -> int:
        """Jobs waiting for a batch."""
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        """Nothing waiting, nothing computing."""
        return not self._waiting and not self.running

    def start(self) -> None:
        """Start gathering (in the running event loop)."""
        self._wake = asyncio.Event()
        self._loop_task = asyncio.get_running_loop().create_task(self._gather_forever())

    async def stop(self) -> None:
        """Stop gathering; the batch computing, if any, finishes first (its thread is joined)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
        await asyncio.gather(*self._computing, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)
        for job in self._waiting:
            if job.future is not None and not job.future.done():
                job.future.cancel()

    def submit(self, job: Job) -> asyncio.Future:
        """Queue `job`; returns the future of its result. Raises `QueueFull` when `max_queue` jobs wait."""
        if len(self._waiting) >= self.max_queue:
            raise QueueFull
        job.future = asyncio.get_running_loop().create_future()
        job.future.add_done_callback(lambda future: self._cancelled(job) if future.cancelled() else None)
        self._waiting.append(job)
        self.metrics.queue_depth.set(len(self._waiting))
        assert self._wake is not None, "Batcher.start() first"
        self._wake.set()
        return job.future

    def _cancelled(self, job: Job) -> None:
        """Take a cancelled job out of the queue (its client gave up: its place goes to the next request); a job
        already taken into a batch finishes there (early, where its runner heeds `on_cancel`), its result dropped."""
        if job.on_cancel is not None:
            job.on_cancel()
        try:
            self._waiting.remove(job)
        except ValueError:
            return
        self.metrics.queue_depth.set(len(self._waiting))

    async def run_now(self, job: Job) -> Any:
        """Run one job in the worker thread, outside the queue (the warm-up request)."""
        job.future = asyncio.get_running_loop().create_future()
        (result,) = await asyncio.get_running_loop().run_in_executor(self._executor, job.run, [job])
        if isinstance(result, BaseException):
            raise result
        return result

    async def _gather_forever(self) -> None:
        while True:
            while not self._waiting or not self._may_start(self._waiting[0]):
                self._wake.clear()
                await self._wake.wait()
            batch = await self._gather()
            if not batch:
                continue
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._computing[task] = batch[0].overlaps
            task.add_done_callback(self._computed)

    def _may_start(self, job: Job) -> bool:
        """Whether `job`'s batch may start now: nothing computes, or it overlaps, as every batch computing does, and
        fewer than `batches_in_flight` compute."""
        if not self._computing:
            return True
        overlapping = all(self._computing.values())
        return job.overlaps and overlapping and len(self._computing) < self.batches_in_flight

    def _computed(self, task: asyncio.Task) -> None:
        del self._computing[task]
        if self._wake is not None:
            self._wake.set()  # the gathering may start the next batch

    async def _gather(self) -> list[Job]:
        """The next batch: the oldest job's compatible jobs, once they hold `max_batch_size` inputs or the wait
        (`batch_wait_s`, at most `WAIT_SHARE` of the key's previous batch's compute time) is over."""
        loop = asyncio.get_running_loop()
        key = self._waiting[0].key
        deadline = loop.time() + self._wait_for(key)
        while self._items_of(key) < self.max_batch_size:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except asyncio.TimeoutError:
                break
        return self._take(key)

    def _wait_for(self, key: Hashable) -> float:
        """How long the oldest job's batch waits for company: `batch_wait_s`, at most `WAIT_SHARE` of the key's
        previous compute time, and not at all for a lone client's next request of a fast call (module docstring)."""
        if key not in self._previous_batch:
            return self.batch_wait_s
        seconds, lone_end = self._previous_batch[key]
        wait = min(self.batch_wait_s, WAIT_SHARE * seconds)
        alone = lone_end is not None and len(self._waiting) == 1 and self._waiting[0].arrived - lone_end <= seconds
        return 0.0 if alone and wait < self.batch_wait_s else wait

    def _items_of(self, key: Hashable) -> int:
        return sum(len(job.items) for job in self._waiting if job.key == key)

    def _take(self, key: Hashable) -> list[Job]:
        """Remove and return the waiting jobs of `key`, oldest first, up to `max_batch_size` inputs (at least one
        job); jobs whose client gave up (timed out) are dropped."""
        batch: list[Job] = []
        kept: deque[Job] = deque()
        items = 0
        for job in self._waiting:
            if job.future is not None and job.future.done():
                continue
            if job.key == key and (not batch or items + len(job.items) <= self.max_batch_size):
                batch.append(job)
                items += len(job.items)
            else:
                kept.append(job)
        self._waiting = kept
        self.metrics.queue_depth.set(len(kept))
        return batch

    async def _run(self, batch: list[Job]) -> None:
        self.running += len(batch)
        self.metrics.batch_size.labels(self.task).observe(sum(len(job.items) for job in batch))
        start = time.perf_counter()
        try:
            results = await asyncio.get_running_loop().run_in_executor(self._executor, batch[0].run, batch)
        except Exception as err:  # noqa: BLE001 (a failure of the runner itself: every job of the batch gets it)
            logger.exception("a batch of %d requests failed", len(batch))
            results = [err] * len(batch)
        finally:
            self.running -= len(batch)
        if len(results) != len(batch):  # a runner's bug: fail its jobs, never the loop that gathers the next ones
            results = [RuntimeError(f"the batch runner gave {len(results)} results for {len(batch)} jobs")] * len(batch)
        seconds = time.perf_counter() - start
        key = batch[0].key
        lone = len(batch) == 1 and not any(job.key == key for job in self._waiting)  # alone, and none came meanwhile
        self._previous_batch.pop(key, None)  # (re-inserted last: the oldest key goes first when full)
        self._previous_batch[key] = (seconds, time.monotonic() if lone else None)
        if len(self._previous_batch) > KEYS_TIMED:
            del self._previous_batch[next(iter(self._previous_batch))]
        self.metrics.batch_seconds.labels(self.task).observe(seconds)
        for job, result in zip(batch, results, strict=True):
            if job.future.done():  # the client timed out or went away
                continue
            if isinstance(result, BaseException):
                job.future.set_exception(result)
            else:
                job.future.set_result(result)


async def cancel_now(future: asyncio.Future) -> None:
    """Cancel a submitted request's `future` and let its done callbacks run before the caller answers the client:
    `Future.cancel` only schedules them, and one of them is the job's `on_cancel` (a generation's rows end at the
    next decoding step). Answered first, a client told of a timeout could still see its decoding go on a step or two
    longer on a loaded machine."""
    future.cancel()
    await asyncio.sleep(0)  # (the callbacks scheduled by cancel run before this coroutine resumes)
