"""Faults the server survives: a streaming client that goes away frees its place (a queued request leaves the queue
at once, a decoding one stops at the next step, and the next request is served), as does a generation past its
timeout; a stage process killed under `torchrun` makes `/health` fail and the job exit non-zero within a bound, idle
or with a request in flight, never hanging. (SIGTERM drains and exits 0, with a request in flight:
tests/serving/test_sigterm.py.)"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time

import httpx
import psutil
import pytest
import torch
from transformers.generation.streamers import BaseStreamer

from .conftest import metric, running_server, stage_server

PROMPT = "The weather today"
MAX_TOKENS = 60  # the tiny GPT-2's 128 positions less the 64 prompt tokens the pipeline pads to, and some
HELD_AT = 4  # tokens decoded before the gate holds the first generation


class Held:
    """The pipeline whose first call holds its decoding after `HELD_AT` tokens until the gate opens (a generation
    as long as the test needs), counting the tokens each call decoded."""

    def __init__(self, pipe) -> None:
        self._pipe, self.gate, self.holding = pipe, threading.Event(), threading.Event()
        self.tokens: list[int] = []

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def __call__(self, *args, **kwargs):
        if "streamer" not in kwargs:  # the warm-up request
            return self._pipe(*args, **kwargs)
        call, streamer = len(self.tokens), kwargs["streamer"]
        self.tokens.append(0)
        held = self

        class Counting(BaseStreamer):
            def put(self, value):
                streamer.put(value)
                if value.dim() == 2 and value.shape[1] > 1:  # the prompts
                    return
                held.tokens[call] += 1
                if call == 0 and held.tokens[call] >= HELD_AT:
                    held.holding.set()
                    assert held.gate.wait(30), "the test never opened the gate"

            def end(self):
                streamer.end()

        kwargs["streamer"] = Counting()
        return self._pipe(*args, **kwargs)


@pytest.fixture(scope="module")
def generator(tiny_pretrained):
    from optimum_ipu.pipelines import pipeline

    return pipeline("text-generation", model=str(tiny_pretrained("GPT2LMHeadModel")))


def _greedy(pipe, prompt: str, max_new_tokens: int) -> str:
    encoded = pipe.tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        ids = pipe.model.generate(
            **encoded, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pipe.tokenizer.pad_token_id
        )
    return pipe.tokenizer.decode(ids[0, encoded["input_ids"].shape[1] :], skip_special_tokens=True)


def _until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.01)


def test_a_client_gone_mid_stream_frees_its_place(generator):
    assert _greedy(generator, PROMPT, HELD_AT).strip(), "the first tokens make no text: pick another prompt"
    held = Held(generator)
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    with (
        running_server(held, max_batch_size=1, max_queue=1, batch_wait_ms=0) as (url, state),
        contextlib.ExitStack() as opened,
        contextlib.ExitStack() as streams,
    ):
        opened.callback(held.gate.set)  # (a failure below: the server's worker is not left holding)
        # A streams; its decoding is held after a few tokens, its first chunk already sent
        first = streams.enter_context(httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30))
        lines = first.iter_lines()
        chunk = next(line for line in lines if line.startswith("data: "))
        assert json.loads(chunk[len("data: ") :])["choices"][0]["text"]
        assert held.holding.wait(30)
        # B waits in the queue (which holds one request), and goes away before it starts
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as second:
            assert second.status_code == 200
            _until(lambda: metric(url, "optimum_ipu_queue_depth") == 1, "B queued")
        _until(lambda: metric(url, "optimum_ipu_queue_depth") == 0, "B gone from the queue")
        # C takes B's place in the queue (no 429), behind A
        out: dict = {}
        c_body = {"model": "tiny", "prompt": "Trains run late because", "max_tokens": 3, "temperature": 0}
        thread = threading.Thread(
            target=lambda: out.update(c=httpx.post(f"{url}/v1/completions", json=c_body, timeout=60))
        )
        thread.start()
        _until(lambda: metric(url, "optimum_ipu_queue_depth") == 1, "C queued")
        # A goes away mid-stream: its decoding stops at the next step, then C is served
        streams.close()
        _until(lambda: metric(url, "optimum_ipu_requests_in_flight") == 1, "A's request ended (C's left)")
        held.gate.set()
        thread.join(timeout=60)
        assert out["c"].status_code == 200, out["c"].text
        assert out["c"].json()["choices"][0]["text"] == _greedy(generator, c_body["prompt"], 3)
        assert held.tokens[0] <= HELD_AT + 1 < MAX_TOKENS, held.tokens  # A's rows ended at the step after the gate
        assert len(held.tokens) == 2, held.tokens  # B never ran
        _until(lambda: state.idle, "the server idle")
        assert metric(url, "optimum_ipu_requests_in_flight") == 0 and metric(url, "optimum_ipu_queue_depth") == 0
        assert metric(url, "optimum_ipu_requests_total", endpoint="/v1/completions", status="429") == 0


def test_a_generation_past_its_timeout_stops_decoding(generator):
    held = Held(generator)
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    with running_server(held, max_batch_size=1, request_timeout=1) as (url, state), contextlib.ExitStack() as opened:
        opened.callback(held.gate.set)  # (a failure below: the server's worker is not left holding)
        late = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert late.status_code == 504, late.text
        held.gate.set()
        _until(lambda: state.idle, "the server idle")
        assert held.tokens[0] <= HELD_AT + 1 < MAX_TOKENS, held.tokens  # its rows ended at the step after the gate
        again = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 3}, timeout=30)
        assert again.json()["choices"][0]["text"] == _greedy(generator, PROMPT, 3)


def _rank(process: subprocess.Popen, rank: int) -> psutil.Process:
    """The worker of `rank` among torchrun's children (by the RANK torchrun gave it)."""
    for child in psutil.Process(process.pid).children():
        if child.environ().get("RANK") == str(rank):
            return child
    raise AssertionError(f"torchrun has no worker of rank {rank}")


BOUND_S = 60  # torchrun notices a dead worker within a second and stops the others; the bound leaves room


@pytest.mark.parametrize("moment", ["idle", "in flight"])
def test_a_stage_process_killed_ends_the_job(tmp_path, tiny_pretrained, moment):
    folder = tiny_pretrained("BertForSequenceClassification")
    out: dict = {}
    with stage_server(tmp_path, folder, [1, 3], "text-classification") as (process, url, log):
        if moment == "in flight":
            texts = [f"sentence {i} about the weather in town" for i in range(3000)]

            def big_request():
                try:
                    out["response"] = httpx.post(
                        f"{url}/v1/pipeline/text-classification", json={"inputs": texts}, timeout=BOUND_S
                    )
                except httpx.TransportError as err:  # the server went before it answered
                    out["response"] = err

            thread = threading.Thread(target=big_request)
            thread.start()
            _until(lambda: metric(url, "optimum_ipu_requests_in_flight") == 1, "the request in flight")
        killed = time.monotonic()
        _rank(process, 1).kill()
        health = []
        while process.poll() is None:
            assert time.monotonic() - killed < BOUND_S, f"still running {BOUND_S} s after the stage died"
            with contextlib.suppress(httpx.TransportError):
                health.append(httpx.get(f"{url}/health", timeout=2).status_code)
            time.sleep(0.05)
        assert process.returncode != 0
        with pytest.raises(httpx.TransportError):  # nothing answers any more
            httpx.get(f"{url}/health", timeout=2)
        failing = next((i for i, status in enumerate(health) if status != 200), len(health))
        assert 200 not in health[failing:], health  # once /health fails (503 while draining), it stays failed
        if moment == "in flight":
            thread.join(timeout=BOUND_S)
            response = out["response"]
            if isinstance(response, httpx.Response):  # answered with the failure, not left hanging
                assert response.status_code >= 500, response.text
    text = log.read_text()
    # process 0 says in one line that it could not release the dead stage, with no traceback of its own
    assert "the other stage processes could not be released" in text and "[rank0]: Traceback" not in text, text[-3000:]


@pytest.mark.parametrize("moment", ["idle", "at a request"])
def test_a_stopped_stage_process_ends_the_server(tmp_path, tiny_pretrained, moment):
    """A stage process that stops without dying (SIGSTOP: a hung host), which torchrun does not notice: idle, its
    silent heartbeat turns /health to 503; at a request, the request fails after --stage-timeout (a 500, not a hang).
    Either way process 0 drains and exits with code 1."""
    folder = tiny_pretrained("BertForSequenceClassification")
    flags = ("--stage-timeout", "3")
    with stage_server(tmp_path, folder, [1, 3], "text-classification", *flags) as (process, url, log):
        stopped, leader = _rank(process, 1), _rank(process, 0)
        stopped.suspend()  # (resumed and killed on leaving)
        sent = time.monotonic()
        if moment == "idle":
            status = 200
            while status == 200:
                assert time.monotonic() - sent < BOUND_S, "/health still 200"
                try:
                    status = httpx.get(f"{url}/health", timeout=10).status_code
                except httpx.ConnectError:  # refused: it has exited already (between two polls), checked below
                    break
                time.sleep(0.1)
            assert status in (200, 503), status  # 503 while it drains (a short window when idle), then gone
        else:
            post = httpx.post(f"{url}/v1/pipeline/text-classification", json={"inputs": "rain"}, timeout=BOUND_S)
            waited = time.monotonic() - sent
            assert post.status_code == 500 and 2.5 < waited < BOUND_S, (post.status_code, waited)
            with contextlib.suppress(httpx.TransportError):  # (or nothing answers: it has exited already)
                assert httpx.get(f"{url}/health", timeout=2).status_code == 503
        _until(lambda: not leader.is_running() or leader.status() == psutil.STATUS_ZOMBIE, "process 0's exit", BOUND_S)
    assert "a stage process stopped answering" in log.read_text()


@pytest.mark.parametrize(
    ("layout", "batching"),
    [("split", ()), ("split", ("--continuous-batching",)), ("stages", ("--continuous-batching",))],
    ids=["static", "continuous", "stages-continuous"],
)
def test_a_process_of_a_split_model_stopped_mid_stream_ends_the_server(tmp_path, tokenizer_for, layout, batching):
    """Every layer split over 2 processes (`tensor_parallel_size` 2): their exchanges go through shared memory, not
    gloo. Process 1 stopped while a completion streams (a static batch, or rows joined by `--continuous-batching`):
    process 0's next exchange waits --stage-timeout for it, then fails as a collective does (the stream ends, not a
    hang), and process 0 drains and exits. The same through 2 stages with rows joined (each group's exchanges on a
    gloo group of its own, which takes the same timeout)."""
    from ..local_tokenizers import save_tiny_pretrained

    folder = save_tiny_pretrained(  # wide enough that 900 tokens take seconds, so the stop lands mid-stream
        tmp_path / "llama",
        "LlamaForCausalLM",
        tokenizer_for("gpt2"),
        hidden_size=256,
        intermediate_size=1024,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        eos_token_id=None,  # (no early end)
    )
    flags = ("--stage-timeout", "3", *batching)
    layers, tensor_parallel = ([-1], 2) if layout == "split" else ([2, 2], 1)
    with stage_server(tmp_path, folder, layers, "text-generation", *flags, tensor_parallel=tensor_parallel) as (
        process,
        url,
        log,
    ):
        stopped, leader = _rank(process, 1), _rank(process, 0)
        body = {"model": "llama", "prompt": "the rain", "max_tokens": 900, "stream": True}
        chunks = 0
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "temperature": 0}, timeout=BOUND_S) as reply:
            assert reply.status_code == 200, reply.read()
            for line in reply.iter_lines():
                chunks += line.startswith("data: {")
                if chunks == 1:
                    stopped.suspend()  # (resumed and killed on leaving)
                    since = time.monotonic()
        ended = time.monotonic() - since
        assert 2.5 < ended < BOUND_S and chunks < 900, (ended, chunks)
        _until(lambda: not leader.is_running() or leader.status() == psutil.STATUS_ZOMBIE, "process 0's exit", BOUND_S)
    text = log.read_text()
    said = "tensor parallel process 1 of 2 timed out" if layout == "split" else "a stage process stopped answering"
    assert said in text, text[-3000:]
