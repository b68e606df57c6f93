"""A real server for the serving tests: uvicorn in a background thread on a free port of 127.0.0.1, serving a
`pipeline()` object built in the test process (so each test compares the server's answers with the same pipeline
called in-process). One server per test module (module-scoped fixtures): models load once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@contextlib.contextmanager
def running_server(pipe: Any, **settings: Any) -> Iterator[tuple[str, Any]]:
    """`(base URL, ServerState)` of a server answering `pipe` until the block ends; it is healthy (warmed up)
    when the block starts."""
    import uvicorn

    from optimum_ipu.serving import ServeSettings, create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings.setdefault("served_model_name", "tiny")
    app = create_app(pipe, ServeSettings("tiny", port=port, **settings))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    try:
        yield url, app.state.server
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def wait_healthy(url: str, timeout: float = 240.0, process: subprocess.Popen | None = None) -> None:
    # A warm-up that compiles (--backend compile) takes ~25 s on an idle 2-core machine and can take minutes beside
    # another xdist worker (CI timed one out at 60 s); a warm-up that fails says so at once (asserted below), and so
    # does a server `process` that exits first (a refused option: its log says why).
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before it was healthy")
        try:
            response = httpx.get(f"{url}/health", timeout=5)
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        if response.status_code == 200:
            return
        assert "warm-up request failed" not in response.text, response.text
        time.sleep(0.05)
    raise TimeoutError(f"{url} was not healthy within {timeout} s")


def assert_error(response: httpx.Response, status: int, param: str | None, *words: str) -> dict:
    """The response is OpenAI's error shape with `status`, naming `param`, its message one line holding `words`."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    error = body["error"]
    assert error["param"] == param and error["code"] is None, error
    assert "\n" not in error["message"] and all(w in error["message"] for w in words), error["message"]
    return error


def metric(url: str, name: str, **labels: str) -> float:
    """The value of one sample of the server's /metrics (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


@contextlib.contextmanager
def stage_server(
    tmp_path: Path, folder: Path, layers: list[int], task: str, *flags: str, tensor_parallel: int = 1
) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """`optimum-ipu serve` under torchrun, one process a stage of `layers` (`layers_per_ipu`), each stage split over
    `tensor_parallel` processes (`tensor_parallel_size`), healthy within; yields
    the torchrun process, the server's URL and the log's path. Its output goes to a file, not a pipe: workers that
    outlive torchrun would hold a pipe. On leaving, whatever still runs is killed: torchrun's group and each worker
    (torchrun starts each in a session of its own, so killing torchrun's group alone leaves them serving)."""
    import psutil

    from ..conftest import REPO_ROOT
    from ..helpers import TORCHRUN, env, free_port

    config = tmp_path / "ipu_config.json"
    layout = {"layers_per_ipu": layers, "ipus_per_replica": len(layers), "tensor_parallel_size": tensor_parallel}
    config.write_text(json.dumps(layout))
    port, processes = free_port(), len(layers) * tensor_parallel
    command = [*TORCHRUN, f"--nproc_per_node={processes}", f"--master_port={free_port()}", "-m", "optimum_ipu.cli"]
    command += ["serve", str(folder), "--ipu-config", str(config), "--port", str(port), "--task", task, *flags]
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    workers: list[psutil.Process] = []
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout=180, process=process)
        workers = psutil.Process(process.pid).children(recursive=True)  # (all started once the server answers)
        yield process, f"http://127.0.0.1:{port}", log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                worker.resume()  # (a test may have stopped it)
                worker.kill()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def generator(tiny_pretrained):
    """A `text-generation` pipeline of a tiny GPT-2 whose tokenizer has a chat template (a module's own, each module
    its server)."""
    from optimum_ipu.pipelines import pipeline

    pipe = pipeline("text-generation", model=str(tiny_pretrained("GPT2LMHeadModel")))
    pipe.tokenizer.chat_template = CHAT_TEMPLATE
    return pipe
