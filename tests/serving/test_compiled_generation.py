"""`optimum-ipu serve --backend compile` on a tiny GPT-2: the decoding steps compile during the warm-up (at 1 row and
at 2), so a client's request of 1 row and a batch of 3 compile nothing more, and their greedy texts are those of the
eager pipeline."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
from torch._dynamo.utils import counters

from optimum_ipu.pipelines import pipeline

from .conftest import running_server

PROMPTS = ["The weather today", "Trains run late because", "In 1889 the tower"]


@pytest.fixture(scope="module")
def pipes(tiny_pretrained):
    folder = str(tiny_pretrained("GPT2LMHeadModel"))
    return pipeline("text-generation", model=folder, backend="compile"), pipeline("text-generation", model=folder)


def _completion(url: str, prompt: str) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_the_warm_up_compiles_every_shape_a_client_then_sends(pipes):
    compiled, eager = pipes
    assert compiled.runner.backend == "compile" and eager.runner.backend == "eager"
    with running_server(compiled, max_batch_size=4, batch_wait_ms=200) as (url, _):
        graphs = counters["stats"]["unique_graphs"]
        assert hasattr(compiled.model, "_compiled_call") and graphs > 0  # the warm-up's decoding steps compiled
        one = _completion(url, PROMPTS[0])
        with concurrent.futures.ThreadPoolExecutor(3) as pool:  # arriving together: one batch of 3 rows
            batch = list(pool.map(lambda p: _completion(url, p), PROMPTS))
        assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled in a client's request
    greedy = {"max_new_tokens": 8, "do_sample": False, "return_full_text": False}
    expected = [eager(p, **greedy)[0]["generated_text"] for p in PROMPTS]
    assert [one, *batch] == [expected[0], *expected]


def test_a_backend_that_does_not_exist_is_named():
    from optimum_ipu.serving import ServeSettings

    with pytest.raises(ValueError, match="backend: got 'fast'; give one of auto, eager, compile, onnxruntime"):
        ServeSettings("tiny", backend="fast")
