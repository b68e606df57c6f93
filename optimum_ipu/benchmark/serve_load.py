"""The servers and the load of `optimum-ipu benchmark --mode serve`.

Each server runs in a process of its own on 127.0.0.1, on a free port, one server at a time (two at once would share
the cores). It is waited for (`/health` for ours, which answers 200 only after its own warm-up request; `/v1/models`
for `transformers serve`), sent `WARMUP_REQUESTS` untimed requests, then the timed request mix from an async `httpx`
client, `concurrency` requests in flight at a time, and stopped: SIGTERM (ours drains and exits 0), then SIGKILL after
`STOP_TIMEOUT_S`.

The request mix is fixed: request `i` of a level sends `PROMPTS[i % 8]` to `/v1/completions`, greedy (`temperature`
0), `max_tokens` new tokens; with `--task question-answering`, `QA_PAIRS[i % 4]` to `/v1/pipeline/question-answering`;
with `--task automatic-speech-recognition`, the recordings of `serve_speech` in turn to `/v1/audio/transcriptions`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx  # (imported where used: a dependency of --mode serve only, in the [benchmark] extra)

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The best way to learn a language is",
    "In 1969, the first people to walk on the moon",
    "A recipe for bread needs flour, water and",
    "The stock market closed higher today after",
    "Photosynthesis is the process by which plants",
    "My favourite film of the year was",
]
QA_PAIRS = [
    {
        "question": "Where was the 50th Super Bowl played?",
        "context": "Super Bowl 50 was an American football game to determine the champion of the National Football "
        "League for the 2015 season. The game was played on February 7, 2016, at Levi's Stadium in the San "
        "Francisco Bay Area at Santa Clara, California.",
    },
    {
        "question": "What do plants make from sunlight?",
        "context": "Photosynthesis is the process by which plants, algae and some bacteria turn light, water and "
        "carbon dioxide into glucose and oxygen. It takes place in the chloroplasts of the leaves.",
    },
    {
        "question": "When did people first walk on the moon?",
        "context": "In July 1969 the Apollo 11 mission landed on the moon, and Neil Armstrong and Buzz Aldrin became "
        "the first people to walk on its surface while Michael Collins stayed in orbit.",
    },
    {
        "question": "What does bread need besides flour?",
        "context": "A simple recipe for bread needs flour, water, salt and yeast; the dough is kneaded, left to rise "
        "for an hour and baked in a hot oven.",
    },
]
COMPLETIONS = "/v1/completions"
QA_ENDPOINT = "/v1/pipeline/question-answering"
TRANSCRIPTIONS = "/v1/audio/transcriptions"
WARMUP_REQUESTS = 2
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 600.0
# what `transformers serve` imports beside FastAPI and uvicorn (`transformers.utils.is_serve_available`)
TRANSFORMERS_SERVE_MODULES = ("fastapi", "uvicorn", "pydantic", "openai")


@dataclass(frozen=True)
class ServerSpec:
    """One server the benchmark can run.

    Args:
        key (`str`): its name on the command line (`--servers ours transformers transformers-cb`).
        name (`str`): its name in the report.
        ready_path (`str`): the `GET` path that answers 200 once it takes requests.
    """

    key: str
    name: str
    ready_path: str


SERVERS = {
    "ours": ServerSpec("ours", "optimum-ipu serve", "/health"),
    "transformers": ServerSpec("transformers", "transformers serve", "/v1/models"),
    "transformers-cb": ServerSpec("transformers-cb", "transformers serve --continuous-batching", "/v1/models"),
    # its --compile: a static KV cache, whose decoding step generate() compiles on accelerators only
    "transformers-compile": ServerSpec("transformers-compile", "transformers serve --compile", "/v1/models"),
}
# the servers a run measures when none are named
DEFAULT_SERVERS = ("ours", "transformers", "transformers-cb")


def transformers_cli() -> str | None:
    """The `transformers` command of this environment (beside this Python, else on `PATH`); None when absent."""
    beside = Path(sys.executable).with_name("transformers")
    return str(beside) if beside.is_file() else shutil.which("transformers")


def missing_dependencies(key: str | None = None) -> str | None:
    """Why server `key` (None: the load generator) cannot run here, as one line naming the fix; None when it can."""
    if key is None:
        if importlib.util.find_spec("httpx") is None:
            return "--mode serve sends its requests with httpx, not installed: pip install 'optimum-ipu[benchmark]'"
        return None
    if key == "ours":
        if any(importlib.util.find_spec(name) is None for name in ("fastapi", "uvicorn")):
            return "optimum-ipu serve needs FastAPI and uvicorn, not installed: pip install 'optimum-ipu[serving]'"
        return None
    if transformers_cli() is None:
        return "the `transformers` command is not installed here: pip install 'transformers[serving]'"
    absent = [name for name in TRANSFORMERS_SERVE_MODULES if importlib.util.find_spec(name) is None]
    if absent:
        return f"transformers serve needs {', '.join(absent)}, not installed: pip install 'transformers[serving]'"
    return None


def server_command(
    key: str,
    model: str,
    port: int,
    task: str,
    max_batch_size: int | None = 8,
    backend: str = "auto",
    generate_kwargs: dict[str, Any] | None = None,
) -> list[str]:
    """The command line that starts server `key` on `model` at 127.0.0.1:`port`.

    Ours runs through this Python (`python -m optimum_ipu.cli serve`), named as the model folder so that every server
    takes the same request bodies, with a request timeout as long as the client's (a slow machine gets its answers
    late, not 504s) and `--max-batch-size` the run's highest concurrency (as a user serving that load sets it);
    `transformers serve` preloads the folder (its `FORCE_MODEL`) and batches as it does by default. `backend`: ours'
    `--backend` (`"auto"`: not given); `max_batch_size` None: ours' default (speech recognition on a CPU: 1, where a
    batch gains nothing); `generate_kwargs`: ours' `--generate-kwargs` (speech recognition: decoding as the
    peer decodes).
    """
    if key == "ours":
        chosen = [] if backend == "auto" else ["--backend", backend]
        if generate_kwargs:
            chosen += ["--generate-kwargs", json.dumps(generate_kwargs)]
        return [
            sys.executable, "-m", "optimum_ipu.cli", "serve", model, "--task", task, "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", model, "--request-timeout", str(int(REQUEST_TIMEOUT_S)),
            *(["--max-batch-size", str(max_batch_size)] if max_batch_size is not None else []), *chosen,
        ]  # fmt: skip
    command = [transformers_cli() or "transformers", "serve", model, "--host", "127.0.0.1", "--port", str(port)]
    flags = {"transformers-cb": ["--continuous-batching"], "transformers-compile": ["--compile"]}
    return command + flags.get(key, [])


TokenCounter = Callable[[int, Any], int]  # (request index, its answer) -> the tokens it generated


def usage_tokens(index: int, answer: Any) -> int:
    """A completion's generated tokens, as its server counted them (`usage.completion_tokens`); 0 without usage."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    return int(usage["completion_tokens"]) if usage else 0


def free_port() -> int:
    """A TCP port of 127.0.0.1 that no one listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def last_line(log: Path) -> str:
    """What a server said before it exited: the last line its log marks `ERROR` (uvicorn's bind failure is followed
    by its shutdown lines), else the last non-empty line, or a placeholder."""
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["(its log is empty)"])[-1]


class PortTakenError(ValueError):
    """The server's port was taken between `free_port()` choosing it and the server binding it (another process's
    connection or listener got it first): started again on another port."""


def wait_ready(process: subprocess.Popen, url: str, spec: ServerSpec, log: Path, timeout: float) -> None:
    """Poll `spec.ready_path` until it answers 200; a `ValueError` (one line, with the server's last line) if the
    process exits first or says its warm-up request failed, a `RuntimeError` after `timeout` seconds."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = last_line(log)
            error = PortTakenError if "address already in use" in said else ValueError
            code = process.returncode
            raise error(f"{spec.name} exited with code {code} before it took requests: {said} (log: {log})")
        try:
            response = httpx.get(url + spec.ready_path, timeout=5)
        except httpx.TransportError:
            response = None
        if response is not None and response.status_code == 200:
            return
        if response is not None and "warm-up request failed" in response.text:  # ours: it will not get healthy
            message = " ".join(str(response.json().get("error", {}).get("message", response.text)).split())
            raise ValueError(f"{spec.name} on this model: {message} (log: {log})")
        time.sleep(0.2)
    raise RuntimeError(f"{spec.name} did not answer {spec.ready_path} within {timeout:.0f} s (log: {log})")


def stop_server(process: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM to the server's process group (ours drains, then exits 0), SIGKILL after `timeout` s; its exit code."""
    if process.poll() is not None:
        return process.returncode
    group = hasattr(os, "killpg")
    os.killpg(process.pid, signal.SIGTERM) if group else process.terminate()
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL) if group else process.kill()
        return process.wait()


PORT_TRIES = 3  # a port taken in the moment between its choice and the bind (a busy machine): another, twice


def start_server(spec: ServerSpec, command_for: Callable[[int], list[str]], log: Path) -> tuple[Any, str, list[str]]:
    """Start `command_for(port)` on a free port (its output to `log`) and wait until it takes requests; the process,
    its base URL and the command. A port taken before the server bound it is retried on another (`PORT_TRIES`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, PORT_TRIES + 1):
        port = free_port()
        command = command_for(port)
        with open(log, "w", encoding="utf-8") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(process, url, spec, log, START_TIMEOUT_S)
        except PortTakenError:
            stop_server(process)
            if attempt == PORT_TRIES:
                raise
            continue
        except BaseException:
            stop_server(process)
            raise
        return process, url, command
    raise AssertionError("unreachable: the last try returns or raises")


@contextlib.contextmanager
def running_server(spec: ServerSpec, command_for: Callable[[int], list[str]], log: Path) -> Iterator[tuple[str, list]]:
    """Start `command_for(port)` (`start_server`), yield its base URL and command once it takes requests, stop it at
    the end."""
    process, url, command = start_server(spec, command_for, log)
    try:
        yield url, command
    finally:
        stop_server(process)


def request_bodies(task: str, model: str, count: int, max_tokens: int) -> list[dict[str, Any]]:
    """The request mix: `count` bodies, the fixed prompts (or question-answer pairs) in turn."""
    if task == "question-answering":
        return [{"inputs": QA_PAIRS[i % len(QA_PAIRS)]} for i in range(count)]
    return [
        {"model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0}
        for i in range(count)
    ]


def post_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """`httpx`'s arguments that send `body`: as JSON, or as a multipart form when it holds a `file` (a transcription:
    `(file name, bytes)`, the other fields as form fields)."""
    if "file" in body:
        return {"files": {"file": body["file"]}, "data": {k: v for k, v in body.items() if k != "file"}}
    return {"json": body}


def check_response(response: httpx.Response, name: str, path: str) -> dict[str, Any]:
    """The response's JSON; a `ValueError` naming the server's message for a 4xx (a request the model refuses:
    `--max-tokens` past its positions), a `RuntimeError` for any other failure."""
    if response.status_code == 200:
        return response.json()
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text
    message = " ".join(str(message).split())[:500]
    error = ValueError if 400 <= response.status_code < 500 else RuntimeError
    raise error(f"{name} answered {response.status_code} to POST {path}: {message}")


def warm_up(url: str, name: str, path: str, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """Send `bodies` (the `WARMUP_REQUESTS` warm-up requests) one after the other, untimed; the first response (its
    greedy text is compared across servers)."""
    import httpx

    responses = []
    for body in bodies:
        response = httpx.post(url + path, **post_kwargs(body), timeout=REQUEST_TIMEOUT_S)
        responses.append(check_response(response, name, path))
    return responses[0]


async def send_load(
    url: str,
    name: str,
    path: str,
    bodies: list[dict[str, Any]],
    concurrency: int,
    done: Callable[[], Any],
    tokens_of: TokenCounter = usage_tokens,
) -> dict[str, Any]:
    """Send every body, at most `concurrency` in flight; each request's seconds (in the order of `bodies`), its
    generated tokens (`tokens_of(i, answer)`: by default its `usage.completion_tokens`, 0 where the endpoint reports
    none) and the wall seconds of the whole level."""
    import httpx

    gate = asyncio.Semaphore(concurrency)
    seconds = [0.0] * len(bodies)
    tokens = [0] * len(bodies)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        async with gate:
            start = time.perf_counter()
            response = await client.post(url + path, **post_kwargs(bodies[i]), timeout=REQUEST_TIMEOUT_S)
            seconds[i] = time.perf_counter() - start
        tokens[i] = tokens_of(i, check_response(response, name, path))
        done()

    limits = httpx.Limits(max_connections=max(concurrency, 10), max_keepalive_connections=max(concurrency, 10))
    async with httpx.AsyncClient(limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(len(bodies))))
        wall = time.perf_counter() - began
    return {"latencies_s": seconds, "completion_tokens": tokens, "wall_s": wall}


def send_one_by_one(
    url: str, name: str, path: str, bodies: list[dict[str, Any]], done: Callable[[], Any]
) -> dict[str, Any]:
    """Send every body from a synchronous `httpx.Client`, one after the other (a lone caller's client, without the
    async client's event loop); the measurements of `send_load`."""
    import httpx

    seconds = []
    with httpx.Client() as client:
        began = time.perf_counter()
        for body in bodies:
            start = time.perf_counter()
            response = client.post(url + path, **post_kwargs(body), timeout=REQUEST_TIMEOUT_S)
            seconds.append(time.perf_counter() - start)
            check_response(response, name, path)
            done()
        wall = time.perf_counter() - began
    return {"latencies_s": seconds, "completion_tokens": [0] * len(bodies), "wall_s": wall}


def measure_server(
    spec: ServerSpec,
    command_for: Callable[[int], list[str]],
    log: Path,
    path: str,
    warmup: list[dict[str, Any]],
    bodies: list[dict[str, Any]],
    concurrencies: tuple[int, ...],
    done: Callable[[], Any],
    one_by_one: bool = False,
    tokens_of: TokenCounter = usage_tokens,
) -> dict[str, Any]:
    """Start one server (`command_for(port)` on a free port), send it the `warmup` bodies untimed, then `bodies` at
    each concurrency in turn (`done()` after each answer), stop it. Returns the command it ran, the first warm-up
    response and each level's raw measurements (`send_load`), keyed by the concurrency as a string (as in JSON);
    with `one_by_one`, also `bodies` from a synchronous client (`send_one_by_one`), keyed `"1-sync"`. `tokens_of`:
    how an answer's generated tokens are counted (`send_load`)."""
    with running_server(spec, command_for, log) as (url, command):
        first = warm_up(url, spec.name, path, warmup)
        levels = {
            str(c): asyncio.run(send_load(url, spec.name, path, bodies, c, done, tokens_of)) for c in concurrencies
        }
        if one_by_one:
            levels["1-sync"] = send_one_by_one(url, spec.name, path, bodies, done)
    return {"command": command, "first_response": first, "levels": levels}


__all__ = [
    "PORT_TRIES",
    "PROMPTS",
    "PortTakenError",
    "QA_PAIRS",
    "DEFAULT_SERVERS",
    "SERVERS",
    "ServerSpec",
    "measure_server",
    "send_one_by_one",
    "missing_dependencies",
    "post_kwargs",
    "request_bodies",
    "usage_tokens",
    "server_command",
    "free_port",
    "start_server",
    "stop_server",
]
