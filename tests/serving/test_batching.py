"""The batcher alone (`optimum_ipu.serving.batching.Batcher`), on a fake runner: a batch waits for company at most
`batch_wait_s` and at most a tenth of its key's previous compute time, so a lone client of a fast call barely waits,
while requests that come together, or a little apart within the wait, still run together."""

from __future__ import annotations

import asyncio
import threading
import time

from optimum_ipu.serving.batching import KEYS_TIMED, Batcher, Job
from optimum_ipu.serving.metrics import ServerMetrics

WAIT_S = 1.0  # the longest wait: long enough that a batch closed by it is told apart from one closed early


def _job(item: str, batches: list[list[str]], compute_s: float) -> Job:
    def run(jobs: list[Job]) -> list[str]:
        batches.append([item for job in jobs for item in job.items])
        time.sleep(compute_s)
        return [job.items[0].upper() for job in jobs]

    return Job(key="k", items=[item], run=run)


async def _timed(future: asyncio.Future) -> tuple[str, float]:
    start = time.perf_counter()
    result = await future
    return result, time.perf_counter() - start


async def _scenario() -> tuple[list[list[str]], dict[str, float]]:
    batcher = Batcher(max_batch_size=8, batch_wait_s=WAIT_S, max_queue=16, metrics=ServerMetrics(), task="test")
    batcher.start()
    batches: list[list[str]] = []
    seconds: dict[str, float] = {}
    try:
        # the key's first batch: nothing known of its compute time, it waits the whole WAIT_S and takes all three
        together = [batcher.submit(_job(name, batches, 0.05)) for name in ("a", "b", "c")]
        results = await asyncio.gather(*(_timed(f) for f in together))
        assert [r for r, _ in results] == ["A", "B", "C"]
        seconds["first"] = results[0][1]
        # the previous batch computed for 0.05 s: a lone request waits 5 ms at most
        result, seconds["lone"] = await _timed(batcher.submit(_job("d", batches, 0.3)))
        assert result == "D"
        # the previous batch computed for 0.3 s: a request 10 ms behind the first still joins its batch (30 ms wait;
        # the first came after a pause longer than that compute, so not as a lone client's next request)
        await asyncio.sleep(0.35)
        first = batcher.submit(_job("e", batches, 0.05))
        await asyncio.sleep(0.01)
        second = batcher.submit(_job("f", batches, 0.05))
        assert await asyncio.gather(first, second) == ["E", "F"]
    finally:
        await batcher.stop()
    return batches, seconds


def test_a_batch_waits_at_most_a_share_of_its_previous_compute_time():
    batches, seconds = asyncio.run(_scenario())
    assert batches == [["a", "b", "c"], ["d"], ["e", "f"]]
    assert seconds["first"] >= WAIT_S * 0.9  # the key's first batch waited the whole batch_wait_s
    assert seconds["lone"] < 0.3 + WAIT_S / 2  # its 0.3 s compute after a wait of WAIT_SHARE x 0.05 s, not WAIT_S


async def _many_keys(keys: int) -> int:
    batcher = Batcher(8, 0.001, 16, ServerMetrics(), "test")
    batcher.start()
    try:
        for key in range(keys):
            job = _job("x", [], 0.0)
            job.key = key  # a call's settings (seed, max_tokens, ...) make a key: as many as clients send
            assert await batcher.submit(job) == "X"
    finally:
        await batcher.stop()
    return len(batcher._previous_batch)


def test_the_compute_times_kept_are_bounded_however_many_keys_come():
    assert asyncio.run(_many_keys(KEYS_TIMED + 20)) == KEYS_TIMED


async def _lone_client(compute_s: float, wait_s: float) -> list[list[str]]:
    """A client that sends its next request once answered (a call of `compute_s`), and another client's request
    1 ms behind its third one; the batches run."""
    batcher = Batcher(max_batch_size=8, batch_wait_s=wait_s, max_queue=16, metrics=ServerMetrics(), task="test")
    batcher.start()
    batches: list[list[str]] = []
    try:
        for name in ("a", "b", "c", "d"):
            future = batcher.submit(_job(name, batches, compute_s))
            if name == "c":  # another client, just behind: it runs with c only if c waited for company
                await asyncio.sleep(0.001)
                other = batcher.submit(_job("x", batches, compute_s))
            assert await future == name.upper()
        assert await other == "X"
    finally:
        await batcher.stop()
    return batches


def test_a_lone_client_of_a_fast_call_does_not_wait_for_company():
    # a 20 ms call, waits of up to 0.2 s: a tenth of the call (2 ms) is below that, so b and c (each sent once the
    # previous was answered, nothing else arriving) run at once, and x, 1 ms behind c, runs after it
    batches = asyncio.run(_lone_client(0.02, 0.2))
    assert batches[:4] == [["a"], ["b"], ["c"], ["x"]] or batches[:4] == [["a"], ["b"], ["c"], ["x", "d"]], batches


def test_a_slow_call_still_waits_for_company():
    # a 0.3 s call and a 5 ms wait: a tenth of the call is not below the wait, so c waits its 5 ms and x, 1 ms behind,
    # joins it (the rule for slow calls, generation, unchanged: a companion missing a batch would wait a whole one)
    batches = asyncio.run(_lone_client(0.3, 0.005))
    assert batches[:3] == [["a"], ["b"], ["c", "x"]], batches


def _meeting_job(key: str, item: str, overlaps: bool, log: list[str], meeting: threading.Barrier) -> Job:
    """A job whose batch waits (at most a second) for another batch to meet it while both compute."""

    def run(jobs: list[Job]) -> list[str]:
        log.append(f"start {item}")
        try:
            meeting.wait(timeout=1.0)
            log.append(f"met {item}")
        except threading.BrokenBarrierError:
            log.append(f"alone {item}")
        log.append(f"end {item}")
        return [item.upper() for _ in jobs]

    return Job(key=key, items=[item], run=run, overlaps=overlaps)


async def _overlapping(batches_in_flight: int) -> list[str]:
    batcher = Batcher(8, 0.0, 16, ServerMetrics(), "test", batches_in_flight=batches_in_flight)
    batcher.start()
    log: list[str] = []
    meeting = threading.Barrier(2)
    try:
        futures = [
            batcher.submit(_meeting_job("k1", "a", True, log, meeting)),
            batcher.submit(_meeting_job("k2", "b", True, log, meeting)),
        ]
        await asyncio.sleep(0.05)
        futures.append(batcher.submit(_meeting_job("k3", "c", False, log, threading.Barrier(2))))
        assert await asyncio.gather(*futures) == ["A", "B", "C"]
        assert batcher.idle
    finally:
        await batcher.stop()
    return log


def test_batches_that_overlap_compute_at_once_and_others_alone():
    """Two batches that overlap (different keys) compute at once with `batches_in_flight=2`; a batch that does not
    overlap starts once both ended; with 1 in flight they run one after the other."""
    log = asyncio.run(_overlapping(2))
    assert {"met a", "met b"} <= set(log)  # both were computing at once
    assert log[-3:] == ["start c", "alone c", "end c"]
    log = asyncio.run(_overlapping(1))
    assert log == ["start a", "alone a", "end a", "start b", "alone b", "end b", "start c", "alone c", "end c"]
