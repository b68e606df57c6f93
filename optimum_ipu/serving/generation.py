"""Running generation requests as one `text-generation` pipeline call, and following each row's tokens.

The requests of one batch share their settings (`max_tokens`, sampling, `n`, stop strings: the batcher's key), so
they run as one call of the pipeline a Python user calls (`pipe(prompts, max_new_tokens=..., ...)`), and decode
together: one `generate()` over the batch's rows. A `RowStreamer` (a `transformers` streamer, handed to
`generate()` through the pipeline) sees each step's tokens of every row and passes them to the row's request: a
streaming request turns them into server-sent events as they come; every request gets its token counts and why
each choice ended from them.

`transformers`' continuous batching managers (`model.init_continuous_batching()`) serve requests of one choice
without a seed instead, greedy or sampled, with `--continuous-batching` (`serving/continuous.py`): a request joins
the running batch at the next step, where here a request that arrives while a batch decodes waits for the next batch
(at most one generation). Measured with requests arriving while others decode, the greedy manager gave 1.35-1.42x
the tokens/s and 0.26-0.31x the p50 latency, the sampling one 1.26-1.28x and 0.35-0.36x
(`benchmarks/continuous_batching.py`); with every request there at once the manager equals one padded `generate()`
(67.0 against 67.2 tokens/s, 8 prompts x 32 tokens of a 124 M GPT-2). This path stays for what the managers do not
take: several choices (a manager fixes their number when it is made), a seed, and a model whose stages are on
separate processes of a `torchrun` job (a model split over them joins rows with this project's engine instead:
`serving/joined.py`).

A request cancelled (a streaming client that went away, a timeout) marks its sink (`GenerationSink.cancelled`): a
`LeaderStop` over the streamer's `gone` rows, a stopping criterion handed to `generate()` beside the streamer, ends
its rows at the next step, so a batch whose requests are all gone stops decoding and the next batch starts. Under
`torchrun`, where the call runs on every process of the job (the model's stages or its split layers on each), the
criterion travels with the call's arguments and the processes agree on the ended rows at each step (one small
collective a step), so that every decoding loop ends together.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.generation.stopping_criteria import StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from ..pipelines.processes import LeaderStop
from .batching import Job
from .tasks import INPUT_ERRORS, InputError, batch_rows


@dataclass
class Choice:
    """One generated sequence of a request: its token ids (up to and with the end-of-sequence token), whether it
    ended on that token, and the text the pipeline made of it."""

    ids: list[int] = field(default_factory=list)
    ended: bool = False
    text: str = ""


@dataclass
class GenerationSink:
    """Where the rows of one request go: `n` choices per prompt, and, for a streaming request, the event loop and
    queue that receive `(choice index, token id)` as they are generated; `cancelled` once its client has gone (set
    in the event loop, read by the worker thread's `LeaderStop`)."""

    prompts: int
    n: int
    loop: asyncio.AbstractEventLoop | None = None
    queue: asyncio.Queue | None = None
    choices: list[Choice] = field(default_factory=list)
    prompt_tokens: int = 0
    cancelled: bool = False

    def __post_init__(self) -> None:
        self.choices = [Choice() for _ in range(self.prompts * self.n)]

    def cancel(self) -> None:
        """The request is cancelled: its rows end at the next decoding step (`RowStreamer.gone`)."""
        self.cancelled = True


class RowStreamer(BaseStreamer):
    """A `transformers` streamer over a batch of requests: row `r` of the padded batch is choice `r % rows_of_job`
    of the job it belongs to; the rows that fill the batch belong to none. Each `generate()` call of the pipeline
    starts with a `put` of the prompts (2-D), which moves on to the call's rows."""

    def __init__(self, sinks: list[GenerationSink], eos_ids: set[int], rows_per_call: list[int]) -> None:
        # the real rows in batch order: (sink, choice index)
        self.rows = [(sink, i) for sink in sinks for i in range(len(sink.choices))]
        self.eos_ids, self.rows_per_call = eos_ids, rows_per_call
        self.call, self.offset, self.width = -1, 0, 0

    def put(self, value: torch.Tensor) -> None:
        if value.dim() == 2 and value.shape[1] > 1 or self.call < 0:  # the prompts of the next generate() call
            self.offset += self.width
            self.call += 1
            self.width = self.rows_per_call[self.call] if self.call < len(self.rows_per_call) else 0
            return
        tokens = value.reshape(-1).tolist()
        for r, token in enumerate(tokens[: self.width]):
            if self.offset + r >= len(self.rows):
                break
            sink, index = self.rows[self.offset + r]
            choice = sink.choices[index]
            if choice.ended or sink.cancelled:
                continue
            choice.ids.append(token)
            choice.ended = token in self.eos_ids
            if sink.queue is not None:
                sink.loop.call_soon_threadsafe(sink.queue.put_nowait, (index, token))

    def end(self) -> None:
        pass

    def gone(self, batch: int) -> list[bool]:
        """For each of the current call's `batch` rows, whether it belongs to a cancelled request; the rows that
        fill the batch count as gone once every real row of the call is (so that such a call ends)."""
        if not any(sink.cancelled for sink, _ in self.rows):
            return [False] * batch
        real = [self.rows[self.offset + r][0].cancelled for r in range(min(self.width, len(self.rows) - self.offset))]
        filler = bool(real) and all(real)
        return [real[r] if r < len(real) else filler for r in range(batch)]


def eos_token_ids(pipe: Any) -> set[int]:
    """The tokens that end a sequence, as `generate()` reads them from the model's generation config."""
    eos = getattr(pipe.model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(pipe.tokenizer, "eos_token_id", None)
    return set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])


def new_text(tokenizer: Any, tokens: list[int]) -> str:
    """The text of a choice's `tokens` as the `text-generation` pipeline makes it without the prompt
    (`return_full_text=False`): the new tokens decoded alone, special tokens left out."""
    return tokenizer.decode(tokens, skip_special_tokens=True)


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """`text` up to the first stop string (OpenAI's output leaves it out), and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def run_generation_batch(pipe: Any, jobs: list[Job], max_batch_size: int, param: str) -> list[Any]:
    """Run the jobs' prompts as one `text-generation` pipeline call; one result per job: its `GenerationSink`,
    filled, or an `InputError` for a job the pipeline refused (a batch that fails is run again job by job)."""
    items = [item for job in jobs for item in job.items]
    kwargs = dict(jobs[0].kwargs)
    seed = kwargs.pop("seed", None)
    try:
        for job in jobs:
            job.context.prompt_tokens = sum(len(prompt_ids(pipe, item, param)) for item in job.items)
        sinks = [job.context for job in jobs]
        for sink in sinks:
            sink.choices = [Choice() for _ in sink.choices]  # a batch run again starts afresh
        size = batch_rows(pipe, len(items), max_batch_size)
        host_rows = pipe.host_batch_rows(size)
        n = kwargs.get("num_return_sequences", 1)
        calls = [min(host_rows, len(items) - start) * n for start in range(0, len(items), host_rows)]
        streamer = RowStreamer(sinks, eos_token_ids(pipe), calls)
        kwargs["stopping_criteria"] = StoppingCriteriaList([LeaderStop(streamer.gone)])  # (the module docstring)
        if seed is not None:  # (a seeded request runs alone: the same seed gives the same tokens)
            torch.manual_seed(seed)
        # (a batch that may overlap decodes beside others where the pipeline can: under torchrun, on stages)
        call = pipe.call_overlapping if jobs[0].overlaps and hasattr(pipe, "call_overlapping") else pipe
        outputs = call(items, batch_size=size, streamer=streamer, **kwargs)
    except InputError as err:
        return _alone(pipe, jobs, max_batch_size, param, err)
    except INPUT_ERRORS as err:
        return _alone(pipe, jobs, max_batch_size, param, InputError(param, f"{param}: {err}"))
    records = itertools.chain.from_iterable(outputs)  # each prompt: n records
    for sink in sinks:
        for choice in sink.choices:
            choice.text = next(records)["generated_text"]
    return sinks


def _alone(pipe: Any, jobs: list[Job], max_batch_size: int, param: str, err: InputError) -> list[Any]:
    if len(jobs) == 1:
        return [err]
    return [run_generation_batch(pipe, [job], max_batch_size, param)[0] for job in jobs]


def prompt_ids(pipe: Any, item: Any, param: str) -> list[int]:
    """The prompt's token ids as the pipeline's own `preprocess` makes them (chat template included; its padding
    left out); an `InputError` when they do not fit its `max_seq_length`."""
    from transformers.utils.chat_template_utils import Chat

    prompt = Chat(item) if isinstance(item, list) else item
    encoded = pipe.preprocess(prompt)
    ids = encoded["input_ids"][0]
    mask = encoded.get("attention_mask")
    ids = (ids[mask[0].bool()] if mask is not None else ids).tolist()
    tokens = len(ids)
    if tokens > pipe.max_seq_length:
        raise InputError(
            param,
            f"{param}: {tokens} tokens, more than the {pipe.max_seq_length} prompt tokens this server's pipeline "
            "takes; shorten it",
        )
    if tokens == 0:
        raise InputError(param, f"{param}: empty; generation continues a prompt of one token or more")
    return ids
