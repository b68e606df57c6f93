"""`optimum-ipu serve` as a user runs it, in its own process: healthy after its warm-up, then SIGTERM while a
request computes: /health and new requests get 503 at once, the request in flight completes with its results, and
the process exits with code 0."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import httpx

from ..conftest import PYTHON, REPO_ROOT
from ..helpers import env, free_port
from .conftest import assert_error, metric, wait_healthy


def test_sigterm_drains_then_exits_0(tiny_pretrained):
    folder = tiny_pretrained("BertForSequenceClassification")
    port = free_port()
    command = [
        PYTHON,
        "-m",
        "optimum_ipu.cli",
        "serve",
        str(folder),
        "--port",
        str(port),
        "--max-batch-size",
        "32",
        "--served-model-name",
        "tiny-bert",
    ]
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout=120)
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny-bert"
        texts = [f"sentence {i} about the weather in town" for i in range(4000)]  # about a second of work
        out: dict = {}

        def big_request():
            out["response"] = httpx.post(f"{url}/v1/pipeline/text-classification", json={"inputs": texts}, timeout=120)

        thread = threading.Thread(target=big_request)
        thread.start()
        deadline = time.monotonic() + 30
        while metric(url, "optimum_ipu_requests_in_flight") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        process.send_signal(signal.SIGTERM)
        while httpx.get(f"{url}/health").status_code == 200:  # draining starts within uvicorn's 0.1 s tick
            time.sleep(0.01)
        assert thread.is_alive(), "the request finished before the server drained: make it longer"
        assert_error(
            httpx.post(f"{url}/v1/pipeline/text-classification", json={"inputs": "x"}), 503, None, "shutting down"
        )
        thread.join(timeout=120)
        response = out["response"]
        assert response.status_code == 200 and len(response.json()) == len(texts)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
        log = process.communicate()[0]
    assert "Application shutdown complete" in log, log[-2000:]
