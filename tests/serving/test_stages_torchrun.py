"""`optimum-ipu serve` under `torchrun`, the model's stages on separate processes: process 0 holds the socket, every
request runs through both stages (each process loaded its stage only), the answers are those of one process, and
SIGTERM to the server's process drains it and releases the other stage: every process, and torchrun, exit with code
0. (SIGTERM to torchrun itself makes torchrun stop its workers and fail, whatever they do: its own behaviour.)"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import httpx
import pytest

from optimum_ipu.pipelines import pipeline

from .conftest import stage_server

TEXTS = ["the movie was great", "a dull, long and tiring film", "fine", "not bad at all", "meh"]


def test_serve_on_two_stages_answers_as_one_process(tmp_path, tiny_pretrained):
    folder = tiny_pretrained("BertForSequenceClassification")
    with stage_server(tmp_path, folder, [1, 3], "text-classification") as (process, url, log):
        want = pipeline("text-classification", model=str(folder))(TEXTS)
        got = httpx.post(f"{url}/v1/pipeline/text-classification", json={"inputs": TEXTS}, timeout=120)
        assert got.status_code == 200, got.text
        for answer, expected in zip(got.json(), want, strict=True):
            assert answer["label"] == expected["label"]
            assert abs(answer["score"] - expected["score"]) < 1e-4
        assert len({round(a["score"], 5) for a in got.json()}) > 1, "identical answers would prove little"
        one = httpx.post(f"{url}/v1/pipeline/text-classification", json={"inputs": TEXTS[1]}, timeout=120)
        assert abs(one.json()["score"] - want[1]["score"]) < 1e-4  # a single input: pipe([x])[0]
        server = int(re.search(r"Started server process \[(\d+)\]", log.read_text()).group(1))
        os.kill(server, signal.SIGTERM)  # process 0 drains, then releases stage 1
        assert process.wait(timeout=120) == 0, log.read_text()[-3000:]
    assert "Application shutdown complete" in log.read_text()


PROMPTS = ["The weather today", "Trains run late because", "Once upon a time", "the movie was"]


def completions_equal_one_process(url: str, folder) -> tuple[list[str], dict]:
    """The server's greedy completions of `PROMPTS` are those of `pipeline()` in this process; returns them and the
    request's body."""
    local = pipeline("text-generation", model=str(folder))
    want = [r[0]["generated_text"] for r in local(PROMPTS, max_new_tokens=8, do_sample=False, return_full_text=False)]
    body = {"model": folder.name, "prompt": PROMPTS, "max_tokens": 8, "temperature": 0}
    got = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert got.status_code == 200, got.text
    assert [c["text"] for c in got.json()["choices"]] == want
    assert len(set(want)) > 2, "identical texts would prove little"
    return want, body


def streamed_texts(url: str, body: dict) -> list[str]:
    """Each choice's text as the chunks of the streamed request `body` add it up."""
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=120) as stream:
        events = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")]
    choices = len(body["prompt"])
    return ["".join(e["choices"][0]["text"] for e in events if e["choices"][0]["index"] == i) for i in range(choices)]


def a_gone_client_leaves_the_job_in_step(url: str, folder, body: dict) -> None:
    """A streaming client gone after its first chunk: its rows end at the next step on every process together (a
    `LeaderStop` that process 0 decides; tests/distributed/test_generation_stages.py checks the rows and steps), so
    the processes stay in step: the next request is answered, as one process answers it."""
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "max_tokens": 48, "stream": True}) as stream:
        assert stream.status_code == 200
        assert next(line for line in stream.iter_lines() if line.startswith("data: {"))
    completions_equal_one_process(url, folder)


def test_completions_on_two_stages_decode_in_groups_as_one_process(tmp_path, tiny_pretrained):
    """Four prompts of one request decode on 2 stages in 2 groups in flight (one per stage); the greedy texts, and a
    streamed request's chunks, are those of one process; a request sent while another decodes starts beside it and
    is answered first; a client gone mid-stream leaves the stages in step."""
    folder = tiny_pretrained("GPT2LMHeadModel", initializer_range=0.5)
    with stage_server(tmp_path, folder, [2, 2], "text-generation") as (_, url, _log):
        want, body = completions_equal_one_process(url, folder)
        assert streamed_texts(url, body) == want
        a_request_joins_the_stages_while_another_decodes(url, folder)
        a_gone_client_leaves_the_job_in_step(url, folder, body)


def a_request_joins_the_stages_while_another_decodes(url: str, folder) -> None:
    """A short request sent once a long one streams its first tokens decodes beside it (`--batches-in-flight`, 2 by
    default): its answer comes before the long one's end; both texts are one process's."""
    local = pipeline("text-generation", model=str(folder))
    # long enough that the short request's lane (its process groups made at its first call) is ready before its end:
    # 30 tokens left 28 ms too few once, beside another worker of the suite
    long_tokens = 60  # (the pipeline pads prompts to 64 tokens of the 128 positions)
    long_body = {"model": folder.name, "prompt": PROMPTS, "max_tokens": long_tokens, "temperature": 0, "stream": True}
    short_body = {"model": folder.name, "prompt": PROMPTS[1], "max_tokens": 2, "temperature": 0}
    lines: list[str] = []
    first_chunk, ended = threading.Event(), []

    def read_long() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json=long_body, timeout=120) as stream:
            for line in stream.iter_lines():
                lines.append(line)
                first_chunk.set()
        ended.append(time.monotonic())

    reader = threading.Thread(target=read_long)
    reader.start()
    assert first_chunk.wait(timeout=120)
    short = httpx.post(f"{url}/v1/completions", json=short_body, timeout=120)
    answered = time.monotonic()
    reader.join(timeout=120)
    assert short.status_code == 200, short.text
    call = {"do_sample": False, "return_full_text": False}
    assert short.json()["choices"][0]["text"] == local(PROMPTS[1], max_new_tokens=2, **call)[0]["generated_text"]
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    texts = ["".join(e["choices"][0]["text"] for e in events if e["choices"][0]["index"] == i) for i in range(4)]
    assert texts == [r[0]["generated_text"] for r in local(PROMPTS, max_new_tokens=long_tokens, **call)]
    assert answered < ended[0], f"the short request waited for the long one ({ended[0] - answered:.3f} s)"


def test_completions_split_over_two_processes_as_one_process(tmp_path, tokenizer_for):
    """`tensor_parallel_size=2`: every layer of the model split over the 2 processes, process 0 holding the socket and
    both computing each request together; the greedy texts are one process's, and a client gone mid-stream leaves
    both in step."""
    from ..local_tokenizers import save_tiny_pretrained

    folder = save_tiny_pretrained(
        tmp_path / "llama", "LlamaForCausalLM", tokenizer_for("gpt2"), initializer_range=0.5, intermediate_size=64
    )
    with stage_server(tmp_path, folder, [-1], "text-generation", tensor_parallel=2) as (_, url, _log):
        _, body = completions_equal_one_process(url, folder)
        a_gone_client_leaves_the_job_in_step(url, folder, body)


@pytest.mark.parametrize("layout", ["split", "stages"])
def test_continuous_batching_over_two_processes_as_one_process(tmp_path, tokenizer_for, tiny_pretrained, layout):
    """`--continuous-batching` with every layer split over the 2 processes, or through 2 stages on them (one group of
    rows a stage in flight; `serving/joined.py`): the rows of one request, a streamed request's chunks, and a request
    that joins the running rows while they decode (answered before their end) get one process's greedy texts; a
    request the joining does not take (a seed) runs between its calls; a client gone mid-stream leaves both processes
    in step; SIGTERM drains, and every process exits with 0."""
    from ..local_tokenizers import save_tiny_pretrained

    if layout == "split":
        folder = save_tiny_pretrained(
            tmp_path / "llama", "LlamaForCausalLM", tokenizer_for("gpt2"), initializer_range=0.5, intermediate_size=64
        )
        layers, tensor_parallel = [-1], 2
    else:
        folder, layers, tensor_parallel = tiny_pretrained("GPT2LMHeadModel", initializer_range=0.5), [2, 2], 1
    flags = ("--continuous-batching",)
    with stage_server(tmp_path, folder, layers, "text-generation", *flags, tensor_parallel=tensor_parallel) as (
        process,
        url,
        log,
    ):
        want, body = completions_equal_one_process(url, folder)
        assert streamed_texts(url, body) == want
        a_request_joins_the_stages_while_another_decodes(url, folder)
        seeded = httpx.post(f"{url}/v1/completions", json={**body, "seed": 3}, timeout=120)  # (batched statically)
        assert [c["text"] for c in seeded.json()["choices"]] == want, seeded.text
        a_gone_client_leaves_the_job_in_step(url, folder, body)
        server = int(re.search(r"Started server process \[(\d+)\]", log.read_text()).group(1))
        os.kill(server, signal.SIGTERM)  # drained: the joining ends, then process 1 is released
        assert process.wait(timeout=120) == 0, log.read_text()[-3000:]
    assert "continuous batching failed" not in log.read_text()
