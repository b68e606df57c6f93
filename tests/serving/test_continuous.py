"""`optimum-ipu serve --continuous-batching` on a tiny GPT-2, with each engine (`transformers`' continuous batching
managers, and this project's joining of rows, `serving/joined.py`): greedy requests run through it (not the static
batcher) with the text of `model.generate` and of the static path (streamed chunks
adding up, stop strings, chat); sampled requests too, each drawing from its own top-p nucleus; seeded and
several-choice requests still batch statically; a streaming client that goes away, or a request past its
timeout, cancels its request in the manager; other tasks and torchrun are refused in one line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import openai
import pytest
import torch
import transformers

from .conftest import metric, running_server
from .test_faults import _until
from .test_generation import PROMPTS, _generate

ENGINES = ("transformers", "optimum-ipu")  # (`--continuous-batching-engine`: its managers, or `serving/joined.py`)


@pytest.fixture(scope="module", params=ENGINES)
def server(generator, request):
    engine = {"continuous_batching": True, "continuous_batching_engine": request.param}
    with running_server(generator, max_batch_size=4, **engine) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0)


def _static_batches(url: str) -> float:
    return metric(url, "optimum_ipu_batch_size_count", task="text-generation")


def test_greedy_requests_run_in_the_continuous_batch_as_generate(server, client, generator):
    url, state = server
    before = _static_batches(url)
    response = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=10, temperature=0)
    assert [c.text for c in response.choices] == [_generate(generator, p, 10) for p in PROMPTS]
    assert all(c.finish_reason == "length" for c in response.choices)
    prompt_tokens = sum(len(generator.tokenizer(p)["input_ids"]) for p in PROMPTS)
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (prompt_tokens, 20)
    messages = [{"role": "user", "content": "Say something"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    expected = generator([{"role": "user", "content": "Say something"}], max_new_tokens=6, do_sample=False)
    assert chat.choices[0].message.content == expected[0]["generated_text"][-1]["content"]
    assert _static_batches(url) == before  # neither went through the static batcher
    assert state.continuous.in_flight == 0


def test_streamed_chunks_and_stop_strings_as_the_static_path(client, generator):
    text = _generate(generator, PROMPTS[0], 12)
    chunks = list(client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text and chunks[-1].choices[0].finish_reason == "length"
    stop = text[3:5]
    stopped = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0, stop=[stop])
    assert stopped.choices[0].text == text[: text.find(stop)] and stopped.choices[0].finish_reason == "stop"


def test_seeded_and_several_choice_requests_still_batch_statically(server, client):
    url, _ = server
    before = _static_batches(url)
    client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0.8, seed=3)
    client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0, seed=3)
    client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0.8, n=2)
    assert _static_batches(url) == before + 3
    sampled = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=4, temperature=0.8, top_p=0.9)
    assert len(sampled.choices) == len(PROMPTS) and _static_batches(url) == before + 3  # (the manager's)


def _manager_ids(continuous, prompt: str, **sampling) -> tuple[list[int], list[int]]:
    """The prompt's ids and the token ids the manager generated for one request of these pipeline arguments (its own
    event loop: the manager hands each result to the loop its request was added from)."""
    from optimum_ipu.serving.generation import GenerationSink, prompt_ids

    kwargs = {"max_new_tokens": 12, "return_full_text": False, "num_return_sequences": 1, **sampling}

    async def run() -> list[int]:
        sink = GenerationSink(prompts=1, n=1)
        future = continuous.submit(sink, [prompt], kwargs, "prompt")
        return (await asyncio.wait_for(future, 60)).choices[0].ids

    return prompt_ids(continuous.pipe, prompt, "prompt"), asyncio.run(run())


def test_sampled_requests_draw_from_their_own_nucleus(server, generator):
    """Sampled requests run in the manager with their own settings: every token lies in the top-p nucleus of the
    model's distribution at its step (`top_p` 0.5 keeps about half of a tiny random model's near-uniform vocabulary,
    so a sampler ignoring it would be caught at once), the draws differ from one request to the next and from the
    greedy tokens, and a greedy request beside them still gets the argmax at every step."""
    _, state = server
    model = generator.model.model if hasattr(generator.model, "model") else generator.model
    sampling = {"do_sample": True, "temperature": 1.0, "top_p": 0.5, "top_k": 0}
    prompt, greedy = _manager_ids(state.continuous, PROMPTS[0], do_sample=False)
    draws = [_manager_ids(state.continuous, PROMPTS[0], **sampling)[1] for _ in range(4)]
    assert len({tuple(d) for d in draws}) > 1 and all(d != greedy for d in draws)
    for ids in [greedy, *draws]:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        for step, token in enumerate(ids):
            probs = logits[step].softmax(-1)
            if ids is greedy:
                assert probs[token] >= probs.max() - 1e-6, step
                continue
            ascending = probs.sort().values.cumsum(-1)
            below = ascending[(probs < probs[token]).sum()] - probs[token]  # the mass of the less likely tokens
            assert below > 1 - sampling["top_p"] - 1e-3, (step, float(below))  # (top-p keeps what lies above 1-p)


@contextlib.contextmanager
def _slowed_steps(state, seconds: float) -> Iterator[list]:
    """Every decoding step of the managers slowed by `seconds` (a hook on the embedding, which every step calls), so
    that a request is still decoding when its client leaves or its time is up; yields the steps run meanwhile."""
    steps: list = []
    slow = lambda module, args: steps.append(time.sleep(seconds))  # noqa: E731
    handle = state.continuous.model.get_input_embeddings().register_forward_pre_hook(slow)
    try:
        yield steps
    finally:
        handle.remove()


def _stopped_early(state, steps: list, bound: int, what: str) -> None:
    """The request left the manager, which then runs no more steps, having run fewer than `bound` (its 60 tokens
    would take more)."""
    _until(lambda: state.continuous.in_flight == 0, what)
    time.sleep(0.3)  # steps the manager would run if it still decoded the request
    ran = len(steps)
    time.sleep(0.3)
    assert len(steps) == ran < bound, ran


def test_a_client_gone_mid_stream_cancels_its_request(server):
    url, state = server
    body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 60, "temperature": 0, "stream": True}
    with _slowed_steps(state, 0.02) as steps:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as stream:
            lines = stream.iter_lines()  # (held: an iterator dropped closes the response, which is the client leaving)
            line = next(line for line in lines if line.startswith("data: "))
            assert json.loads(line[len("data: ") :])["choices"][0]["text"] is not None
            assert state.continuous.in_flight == 1
            assert metric(url, "optimum_ipu_continuous_requests") == 1
            ours = hasattr(state.continuous, "rows")  # (its rows: this project's engine only)
            assert metric(url, "optimum_ipu_continuous_rows", state="running") == (1 if ours else 0)
        _stopped_early(state, steps, 40, "the gone client's request cancelled")
        assert metric(url, "optimum_ipu_continuous_rows", state="running") == 0
        assert metric(url, "optimum_ipu_continuous_requests") == 0
    again = httpx.post(f"{url}/v1/completions", json={**body, "stream": False, "max_tokens": 3}, timeout=30)
    assert again.status_code == 200 and again.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_request_past_its_timeout_is_cancelled_in_the_manager(generator, engine):
    """`--request-timeout 1` with steps slowed to 40 ms: a 60-token greedy request gets its 504, and the manager stops
    decoding it at the next step; the next request is answered."""
    body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 60, "temperature": 0}
    settings = {"continuous_batching": True, "continuous_batching_engine": engine, "request_timeout": 1}
    with running_server(generator, max_batch_size=4, **settings) as (url, state):
        with _slowed_steps(state, 0.04) as steps:
            late = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
            assert late.status_code == 504, late.text
            _stopped_early(state, steps, 50, "the late request cancelled")
        again = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 3}, timeout=30)
        assert again.status_code == 200 and again.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("pipe", "message"),
    [
        (SimpleNamespace(task="question-answering"), "this server's task is question-answering"),
        (SimpleNamespace(task="text-generation", lockstep=object()), "leave it out under torchrun"),
    ],
)
def test_refused_where_the_manager_cannot_serve(pipe, message):
    from optimum_ipu.serving.continuous import ContinuousGeneration

    with pytest.raises(ValueError, match=message):
        ContinuousGeneration.check(pipe)


def test_ours_refused_for_other_layouts_and_tasks():
    """Under `torchrun`, rows join where each process holds a share of every layer, or through stages that are every
    process of the job (one replica, tests/serving/test_stages_torchrun.py): a model neither split nor staged is
    refused; a sliding-window cache is refused at start, not at the first request; an engine named without the flag
    is refused too."""
    from optimum_ipu.serving.joined import JoinedGeneration
    from optimum_ipu.serving.settings import ServeSettings

    with pytest.raises(ValueError, match="this server's task is question-answering"):
        JoinedGeneration.check(SimpleNamespace(task="question-answering"))
    other = SimpleNamespace(task="text-generation", lockstep=object(), model=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="rows join a running batch through stages that are every process"):
        JoinedGeneration.check(other)
    window = transformers.MistralConfig(sliding_window=4, num_hidden_layers=2)
    sliding = SimpleNamespace(task="text-generation", model=SimpleNamespace(config=window))
    with pytest.raises(ValueError, match="SimpleNamespace's KV cache keeps a sliding window"):
        JoinedGeneration.check(sliding)
    with pytest.raises(ValueError, match="continuous_batching_engine: got 'optimum-ipu' without continuous batching"):
        ServeSettings("m", continuous_batching_engine="optimum-ipu")
    with pytest.raises(ValueError, match="continuous_batching_engine: got 'vllm'; give one of auto, transformers"):
        ServeSettings("m", continuous_batching=True, continuous_batching_engine="vllm")


def test_ours_stops_joining_while_another_call_waits_for_the_processes(generator):
    """Under `torchrun`, a call of the job that waits for the processes while rows decode (in a lane: a
    several-choice request through stages; alone: a seeded one) stops the joining: waiting rows do not join, every
    group is told the decoding is finished once its rows are done, and the decoding thread lets that call go first;
    afterwards the rows join, each group up to an even part of them (not the first group all it has room for)."""
    from optimum_ipu.runtime.lockstep import Lanes
    from optimum_ipu.serving.joined import JoinedGeneration, _Request, _Row

    joined = JoinedGeneration(generator, max_batch_size=8)
    lanes = Lanes(2)
    joined.pipe = SimpleNamespace(lockstep=SimpleNamespace(lanes=lanes))  # (process 0 of a job)
    request = _Request(future=None, sink=SimpleNamespace(cancelled=False), pending=3)
    joined.waiting.extend(_Row(request, i, [5 + i, 6], 4, (0.0, 1.0), []) for i in range(3))

    def call_in_a_lane() -> None:
        with lanes.lane():
            pass

    with lanes.alone():  # the joining's own decoding call
        joined.begin(2)
        waiter = threading.Thread(target=call_in_a_lane)
        waiter.start()
        _until(lambda: lanes.calls_waiting_for_a_lane == 1, "the call in a lane waiting")
        for group in (0, 1):
            control = joined.control(0, group)
            assert control.joins == [] and control.finished, group
        assert joined._others_wait(running=0) and len(joined.waiting) == 3
    waiter.join(timeout=10)
    assert not waiter.is_alive() and not joined._others_wait(running=0)
    joined.begin(2)  # the next decoding call: 2 groups of up to 4 rows each, the 3 rows spread over both
    assert [len(joined.control(0, g).joins) for g in (0, 1)] == [2, 1] and not joined.waiting
