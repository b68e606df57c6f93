"""Each pipeline schedule's bubble, measured beside its theory (issue 26, item 5).

    torchrun --nproc_per_node 2 benchmarks/pipeline_schedules.py [--layers 8] [--micro-batches 4] [--steps 5]

A GPT-2 (width 256, `--layers` layers, random weights) trains on 2 processes: GPipe and 1F1B with one stage per
process (p = 2), Interleaved1F1B and ZeroBubble with two (4 stages, v = 2). Each stage's forward + backward of one
micro-batch is first timed alone (`runtime.stages.balance.measure_stage_seconds`, every stage in process 0 while the
other waits); a process's busy time in a step is then `m x` the sum over its stages, and the measured bubble is
`1 - busy / step time` for the busier process (communication counts as bubble). Theory: `(p - 1) / (m + p - 1)`
for GPipe and 1F1B, `(p - 1) / (v m)` for Interleaved1F1B, the same or less for ZeroBubble (its weight gradients
fill the bubble). Rank 0 prints one line per schedule and writes `--json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import transformers

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.models.layout import layers_per_stage
from optimum_ipu.runtime.stages.balance import measure_stage_seconds
from optimum_ipu.runtime.stages.engine import PipelineEngine
from optimum_ipu.runtime.step import run_steps

SCHEDULES = {"GPipe": 1, "1F1B": 1, "Interleaved1F1B": 2, "ZeroBubble": 2}  # stages per process


def make_model(layers: int) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=256, n_layer=layers, n_head=4, vocab_size=8000, n_positions=128)
    return transformers.GPT2LMHeadModel(config).train()


def run_schedule(name: str, args: argparse.Namespace, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    ranks = dist.get_world_size()
    stages = ranks * SCHEDULES[name]
    config = IPUConfig(layers_per_ipu=[-1] * stages, gradient_accumulation_steps=args.micro_batches)
    model = make_model(args.layers)
    pipelined = to_pipelined(model, config, parallelize=True)
    cut = pipelined.stage_cut()
    counts = layers_per_stage(config, len(cut.layer_paths), inference=False)
    micro = {k: v[: args.rows] for k, v in batch.items()}
    # every stage alone, in process 0 while the other waits (so they do not share the cores), then told to all
    alone = [measure_stage_seconds(model, cut, counts, micro, repeats=5, warmup=1) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(alone, src=0)
    alone = alone[0]
    engine = PipelineEngine(model, config, cut, list(batch), counts=counts, schedule=name)
    steps = []
    for step in range(args.steps + 1):
        dist.barrier()
        start = time.perf_counter()
        run_steps(engine, None, batch, args.micro_batches)  # the schedule alone: no optimizer step is timed
        dist.barrier()
        if step:  # the first step infers shapes
            steps.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    step_s = statistics.median(steps)
    busy = max(args.micro_batches * sum(alone[s] for s in range(r, stages, ranks)) for r in range(ranks))
    p, v, m = ranks, SCHEDULES[name], args.micro_batches
    theory = (p - 1) / (m + p - 1) if v == 1 else (p - 1) / (v * m)
    return {"step_s": step_s, "busy_s": busy, "bubble": 1 - busy / step_s, "theory": theory, "stages": stages}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--rows", type=int, default=2, help="rows of one micro-batch")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", default="pipeline_schedules.json")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    dist.init_process_group("gloo")
    ids = torch.randint(
        0, 8000, (args.rows * args.micro_batches, args.seq_len), generator=torch.Generator().manual_seed(0)
    )
    batch = {"input_ids": ids, "labels": ids}
    results = {name: run_schedule(name, args, batch) for name in SCHEDULES}
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} processes, {args.micro_batches} micro-batches of {args.rows} x {args.seq_len}")
        for name, r in results.items():
            print(
                f"{name:16s} {r['stages']} stages  step {r['step_s'] * 1e3:8.1f} ms  busy {r['busy_s'] * 1e3:8.1f} ms  "
                f"bubble measured {r['bubble']:.2f}  theory {r['theory']:.2f}"
            )
        with open(args.json, "w") as f:
            headline = ", ".join(f"{n} {r['bubble']:.2f} ({r['theory']:.2f})" for n, r in results.items())
            json.dump(
                {"args": vars(args), "schedules": results, "headline": f"bubble (theory): {headline}"}, f, indent=2
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
