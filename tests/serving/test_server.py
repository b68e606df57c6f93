"""The server's service: /health, /metrics, /v1/models, /v1/pipeline/<task> against the in-process pipeline,
batching by arrival, the queue (429), the timeout (504), the body limit (413), draining (503), and every bad
request answered with a 4xx in OpenAI's error shape naming the field."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from .conftest import assert_error, metric, running_server

TEXTS = ["a fine day", "rain again", "the match was a draw", "what a film", "cold soup", "late trains"]


class Gated:
    """The pipeline behind a gate: a call waits until the gate opens (a model that takes as long as a test needs)."""

    def __init__(self, pipe) -> None:
        self._pipe, self.gate = pipe, threading.Event()
        self.gate.set()

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def __call__(self, *args, **kwargs):
        assert self.gate.wait(30), "the test never opened the gate"
        return self._pipe(*args, **kwargs)


# the server runs the pipeline in its config's inference layout: 2 stages, 2 device iterations a host call
LAYOUT = {"layers_per_ipu": [2, 2], "ipus_per_replica": 2, "inference_device_iterations": 2}


@pytest.fixture(scope="module")
def classifier(tiny_pretrained):
    from optimum_ipu.pipelines import pipeline

    folder = str(tiny_pretrained("BertForSequenceClassification"))
    return pipeline("text-classification", model=folder, ipu_config=LAYOUT)


@pytest.fixture(scope="module")
def server(classifier):
    with running_server(classifier, max_batch_size=8, batch_wait_ms=20, max_body_bytes=4096) as running:
        yield running


def test_the_layout_is_said_once_at_start(classifier):
    from optimum_ipu.serving.server import layout_note

    note = layout_note(classifier)
    assert "2 stage(s) x 1 replica(s)" in note and "torchrun --nproc_per_node" in note


def test_health_models_and_metrics(server):
    url, state = server
    assert httpx.get(f"{url}/health").json() == {"status": "ok", "model": "tiny", "task": "text-classification"}
    models = httpx.get(f"{url}/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    assert httpx.get(f"{url}/v1/models/tiny").json()["id"] == "tiny"
    assert_error(httpx.get(f"{url}/v1/models/other"), 404, "model", "'other'", "'tiny'")
    before = metric(url, "optimum_ipu_requests_total", endpoint="/v1/models", status="200")
    httpx.get(f"{url}/v1/models")
    assert metric(url, "optimum_ipu_requests_total", endpoint="/v1/models", status="200") == before + 1
    text = httpx.get(f"{url}/metrics").text
    names = ("request_seconds_bucket", "batch_size_bucket", "queue_depth", "requests_in_flight", "generated_tokens")
    for name in names:
        assert f"optimum_ipu_{name}" in text, name


def test_pipeline_endpoint_equals_the_pipeline(server, classifier):
    url, _ = server
    response = httpx.post(f"{url}/v1/pipeline/text-classification", json={"inputs": TEXTS[:3], "top_k": 2})
    assert response.status_code == 200, response.text
    assert response.json() == classifier(TEXTS[:3], top_k=2)
    # one input: the result of that input (the list call's element)
    one = httpx.post(f"{url}/v1/pipeline/sentiment-analysis", json={"inputs": TEXTS[0], "model": "tiny"}).json()
    assert one == classifier([TEXTS[0]])[0]


def test_requests_arriving_while_a_batch_computes_run_as_one_batch(classifier):
    """Requests that arrive while the model computes wait, and the next batch takes them all; a bad input among them
    gets its 400 and the others their results. (A batch's own wait for company is a tenth of the previous call at
    most: tests/serving/test_batching.py.)"""
    gated = Gated(classifier)
    with running_server(gated, max_batch_size=8) as (url, state):
        for inputs, expect_bad in ((TEXTS, False), ([*TEXTS, 5], True)):
            gated.gate.clear()
            out: list = []
            threads = [_post_in_thread(url, {"inputs": "first"}, out)]
            _wait_for(lambda: state.batcher.running == 1)  # the first computes, held at the gate
            calls = metric(url, "optimum_ipu_batch_size_count", task="text-classification")
            threads += [_post_in_thread(url, {"inputs": text}, out) for text in inputs]
            waiting = len(inputs)
            _wait_for(lambda: state.batcher.depth == waiting)  # noqa: B023 (read at once) the others wait
            gated.gate.set()
            for thread in threads:
                thread.join()
            by_input = {json.dumps(json.loads(r.request.content)["inputs"]): r for r in out}
            assert [by_input[json.dumps(t)].json() for t in TEXTS] == classifier(TEXTS)
            if expect_bad:  # the batch failed on it and was run again request by request, within the same call
                assert_error(by_input["5"], 400, "inputs", "refused")
            assert metric(url, "optimum_ipu_batch_size_count", task="text-classification") - calls == 1


def test_bad_requests_name_the_field(server):
    url, _ = server
    post = lambda body, **kw: httpx.post(f"{url}/v1/pipeline/text-classification", json=body, **kw)  # noqa: E731
    assert_error(post({"inputs": "x", "batch_size": 4}), 400, "batch_size", "got 4", "--max-batch-size")
    assert_error(post({"top_k": 1}), 400, "inputs", "missing")
    assert_error(post({"inputs": []}), 400, "inputs", "got []")
    assert_error(post({"inputs": "x", "model": "gpt-4"}), 404, "model", "'gpt-4'", "'tiny'")
    assert_error(post({"inputs": 5}), 400, "inputs", "text-classification pipeline refused it")
    # an argument the pipeline refuses is named as the field at fault, not the inputs
    assert_error(post({"inputs": "x", "function_to_apply": 3}), 400, "function_to_apply", "refused it", "3")
    bad_json = httpx.post(f"{url}/v1/pipeline/text-classification", content=b'{"inputs": ')
    assert_error(bad_json, 400, "body", "not valid JSON")
    assert_error(httpx.post(f"{url}/v1/pipeline/text-classification", json=[1]), 400, "body", "JSON list")
    assert_error(httpx.post(f"{url}/v1/pipeline/ner", json={"inputs": "x"}), 404, "task", "text-classification")
    assert_error(httpx.post(f"{url}/v1/embeddings", json={"input": "x"}), 404, None, "feature-extraction")
    assert_error(httpx.post(f"{url}/v1/completions", json={"prompt": "x"}), 404, None, "text-generation")
    assert_error(httpx.get(f"{url}/v1/nothing"), 404, None, "/v1/nothing")
    assert_error(httpx.get(f"{url}/v1/pipeline/text-classification"), 405, None, "GET")
    # the OpenAI bodies are checked field by field, whatever the task served
    assert_error(httpx.post(f"{url}/v1/completions", json={"prompt": "x", "n": 0}), 400, "n", "got 0")


def test_bodies_past_the_limit_get_413(server):
    url, _ = server
    big = {"inputs": "word " * 1000}  # 5 kB > 4096
    assert_error(httpx.post(f"{url}/v1/pipeline/text-classification", json=big), 413, "body", "--max-body-bytes")

    def chunks():  # no Content-Length: the limit is counted as the body arrives
        for _ in range(10):
            yield b" " * 1000

    chunked = httpx.post(f"{url}/v1/pipeline/text-classification", content=chunks())
    assert_error(chunked, 413, "body", "--max-body-bytes")
    assert metric(url, "optimum_ipu_rejected_requests_total", reason="body_too_large") >= 2


def _post_in_thread(url: str, body: dict, out: list) -> threading.Thread:
    def post():
        out.append(httpx.post(f"{url}/v1/pipeline/text-classification", json=body, timeout=30))

    thread = threading.Thread(target=post)
    thread.start()
    return thread


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_full_queue_answers_429_with_retry_after(classifier):
    gated = Gated(classifier)
    with running_server(gated, max_queue=2, batch_wait_ms=0) as (url, state):
        gated.gate.clear()
        out: list = []
        threads = [_post_in_thread(url, {"inputs": "running"}, out)]
        _wait_for(lambda: state.batcher.running == 1)  # the first computes (held at the gate)
        threads += [_post_in_thread(url, {"inputs": t, "top_k": k}, out) for k, t in enumerate(TEXTS[:2], 1)]
        _wait_for(lambda: state.batcher.depth == 2)  # two wait: the queue is full
        refused = httpx.post(f"{url}/v1/pipeline/text-classification", json={"inputs": "one too many"})
        assert_error(refused, 429, None, "--max-queue")
        assert refused.headers["Retry-After"] == "1"
        gated.gate.set()
        for thread in threads:
            thread.join()
        assert sorted(r.status_code for r in out) == [200, 200, 200]
        assert metric(url, "optimum_ipu_rejected_requests_total", reason="queue_full") == 1


def test_a_request_past_its_timeout_gets_504_and_the_server_goes_on(classifier):
    gated = Gated(classifier)
    with running_server(gated, request_timeout=0.5) as (url, state):
        gated.gate.clear()
        started = time.monotonic()
        late = httpx.post(f"{url}/v1/pipeline/text-classification", json={"inputs": "slow"})
        assert_error(late, 504, None, "0.5 s", "--request-timeout")
        assert 0.4 < time.monotonic() - started < 5
        gated.gate.set()
        _wait_for(lambda: state.batcher.idle)
        fine = httpx.post(f"{url}/v1/pipeline/text-classification", json={"inputs": TEXTS[0]})
        assert fine.status_code == 200 and fine.json() == classifier([TEXTS[0]])[0]


def test_draining_refuses_new_requests_and_finishes_those_in_flight(classifier):
    gated = Gated(classifier)
    with running_server(gated) as (url, state):
        gated.gate.clear()
        out: list = []
        thread = _post_in_thread(url, {"inputs": TEXTS}, out)
        _wait_for(lambda: state.batcher.running == 1)
        state.begin_draining()
        assert_error(httpx.get(f"{url}/health"), 503, None, "draining")
        assert_error(
            httpx.post(f"{url}/v1/pipeline/text-classification", json={"inputs": "x"}), 503, None, "shutting down"
        )
        assert not state.idle  # the request in flight is still counted
        gated.gate.set()
        thread.join()
        assert out[0].status_code == 200 and out[0].json() == classifier(TEXTS)
        _wait_for(lambda: state.idle)


def test_a_server_of_an_onnx_runtime_model_leaves_the_cores_to_it(monkeypatch):
    import types

    import torch

    from optimum_ipu.serving.server import leave_cores_to_onnx_runtime

    threads = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        torch.set_num_threads(2)
        leave_cores_to_onnx_runtime(types.SimpleNamespace(runner=types.SimpleNamespace(backend="eager")))
        assert torch.get_num_threads() == 2  # torch runs the model: its threads stay
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        leave_cores_to_onnx_runtime(types.SimpleNamespace(runner=types.SimpleNamespace(backend="onnxruntime")))
        assert torch.get_num_threads() == 2  # the user's own setting stays
        monkeypatch.delenv("OMP_NUM_THREADS")
        leave_cores_to_onnx_runtime(types.SimpleNamespace(runner=types.SimpleNamespace(backend="onnxruntime")))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
