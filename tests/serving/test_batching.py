"""The batcher alone (`optimum_ipu.serving.batching.Batcher`), on a fake runner: a batch waits for as many requests as
the previous batch of its key held, so a lone client's requests never wait for company and requests that come together
still run together."""

from __future__ import annotations

import asyncio
import time

from optimum_ipu.serving.batching import Batcher, Job
from optimum_ipu.serving.metrics import ServerMetrics

WAIT_S = 1.0  # long enough that a batch closed by its wait is told apart from one closed at once


def _job(item: str, batches: list[list[str]]) -> Job:
    def run(jobs: list[Job]) -> list[str]:
        batches.append([item for job in jobs for item in job.items])
        return [job.items[0].upper() for job in jobs]

    return Job(key="k", items=[item], run=run)


async def _scenario() -> tuple[list[list[str]], dict[str, float]]:
    batcher = Batcher(max_batch_size=8, batch_wait_s=WAIT_S, max_queue=16, metrics=ServerMetrics(), task="test")
    batcher.start()
    batches: list[list[str]] = []
    seconds: dict[str, float] = {}
    try:
        # three requests together: the first batch waits for company (up to WAIT_S) and takes all three
        start = time.perf_counter()
        together = [batcher.submit(_job(name, batches)) for name in ("a", "b", "c")]
        assert await asyncio.gather(*together) == ["A", "B", "C"]
        seconds["first"] = time.perf_counter() - start
        # a lone request after a batch of 3 waits for 3, gets none: it runs after the wait
        start = time.perf_counter()
        assert await batcher.submit(_job("d", batches)) == "D"
        seconds["after three"] = time.perf_counter() - start
        # the previous batch held one: the next lone request runs at once
        start = time.perf_counter()
        assert await batcher.submit(_job("e", batches)) == "E"
        seconds["after one"] = time.perf_counter() - start
    finally:
        await batcher.stop()
    return batches, seconds


def test_a_batch_waits_for_as_many_requests_as_the_previous_batch_held():
    batches, seconds = asyncio.run(_scenario())
    assert batches == [["a", "b", "c"], ["d"], ["e"]]
    assert seconds["first"] >= WAIT_S * 0.9  # the first batch waited (for up to max_batch_size)
    assert seconds["after three"] >= WAIT_S * 0.9
    assert seconds["after one"] < WAIT_S / 4  # a lone client's request did not wait
