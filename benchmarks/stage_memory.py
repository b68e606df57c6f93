"""Peak memory per process of a pipeline over processes: each stage loaded alone (stage-local) against the whole model
loaded in every process (the path before it), in one run.

    python benchmarks/stage_memory.py --preset 1b --out output/stage_memory      # ~1.1 B Llama, 4.4 GB fp32
    python benchmarks/stage_memory.py --preset small --scenarios stage-4x1       # the ~60 M version CI asserts

It writes a random Llama as sharded safetensors (fp32) once, then runs one AdamW training step per scenario under
`torchrun` on gloo: 4 stages x 1 replica, and 2 stages x 2 replicas with `--fsdp`, each loaded stage-local
(`optimum_ipu.models.stage_loading.load_stage`) and whole (`transformers`' `from_pretrained` in every process).
For every process it prints the peak resident memory (`ru_maxrss`) above its base, its share (the parameters it
holds x 4: weights, gradients, two AdamW moments, fp32) and the ratio of the two; the job's total peak against one
whole-model process. The base of a process is the peak of the same process in the same job on a model of next to no
weights (`PRESETS["reference"]`: torch, transformers, gloo, the schedule's buffers, the activations). JSON in
OUT/stage_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

PRESETS = {  # Llama shapes: TinyLlama-1.1B's, and a ~60 M one for CI
    "1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32},
    "small": {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8},
    # the reference: the same job on a model of next to no weights (same vocabulary, so the same logits) measures
    # what a process takes besides its share (torch, transformers, gloo, the schedule, activations)
    "reference": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4},
}
SCENARIOS = {  # name: (layers_per_ipu, replicas, fsdp, loading)
    "stage-4x1": ([-1, -1, -1, -1], 1, False, "stage"),
    "whole-4x1": ([-1, -1, -1, -1], 1, False, "whole"),
    "stage-2x2-fsdp": ([-1, -1], 2, True, "stage"),
    "whole-2x2-fsdp": ([-1, -1], 2, True, "whole"),
}
SEQ = 64


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def write_model(folder: Path, preset: str) -> None:
    import torch
    import transformers

    if (folder / "config.json").exists():
        return
    shape = PRESETS[preset]
    config = transformers.LlamaConfig(
        vocab_size=32000, num_key_value_heads=4, tie_word_embeddings=False, dtype="float32", **shape
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder, max_shard_size="500MB")
    print(f"wrote {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters to {folder}", flush=True)


def count_reduce_scatter_bytes() -> dict:
    """Counts the bytes sent into FSDP's gradient reduce-scatters from now on (`original` undoes it)."""
    import torch.distributed as dist

    sent = {"bytes": 0, "original": dist.reduce_scatter_single}

    def counting(*args, **kwargs):
        tensor = kwargs.get("input", args[1] if len(args) > 1 else None)
        sent["bytes"] += tensor.numel() * tensor.element_size()
        return sent["original"](*args, **kwargs)

    dist.reduce_scatter_single = counting  # FSDP2 calls it through the module
    return sent


def worker(model_dir: str, scenario: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    import transformers

    from optimum_ipu import IPUConfig, to_pipelined
    from optimum_ipu.models.layout import layers_per_stage
    from optimum_ipu.models.stage_loading import load_stage
    from optimum_ipu.runtime.fsdp import local_parameter_bytes
    from optimum_ipu.runtime.stages.engine import PipelineEngine
    from optimum_ipu.runtime.step import run_steps

    dist.init_process_group("gloo")
    bare = peak_rss_bytes()
    layout, replicas, fsdp, loading = SCENARIOS[scenario]
    stages = len(layout)
    config = IPUConfig(layers_per_ipu=layout, replication_factor=replicas, gradient_accumulation_steps=stages)
    if loading == "stage":
        pipelined = load_stage("LlamaForCausalLM", model_dir, config, device=torch.device("cpu"))
    else:
        model = transformers.LlamaForCausalLM.from_pretrained(model_dir)
        pipelined = to_pipelined(model, config, parallelize=True)
    model = pipelined.model.train()
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    counts = layers_per_stage(config, pipelined.num_layers, inference=False)
    keys = ["input_ids", "attention_mask", "labels"]
    engine = PipelineEngine(model, config, pipelined.stage_cut(), keys, counts=counts, fsdp=fsdp)
    trained = [p for p in engine.params if p.requires_grad]
    adamw = torch.optim.AdamW(trained, lr=1e-4, fused=True)  # Trainer's default
    ids = torch.randint(0, model.config.vocab_size, (stages, SEQ), generator=torch.Generator().manual_seed(0))
    sent = {}
    # Sharded, a first step reduce-scatters after every micro-batch (the path before), then one step as it runs now:
    # once per step. The bytes sent into FSDP's reduce-scatters are counted for each.
    for once in [False, True] if fsdp else [True]:
        engine.reduce_once_per_step = once
        sent[once] = count_reduce_scatter_bytes()
        step = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        run_steps(engine, adamw, step, micro_batches=stages)  # one optimizer step of a row per micro-batch
        dist.reduce_scatter_single = sent[once]["original"]
    held = local_parameter_bytes(p for p in model.parameters())
    report = {"bare": bare, "peak": peak_rss_bytes(), "held": held, "share": 4 * held, "whole": whole}
    if fsdp:
        per_step = {"every micro-batch": sent[False]["bytes"], "once": sent[True]["bytes"]}
        report["reduce_scattered_bytes_per_step"] = per_step
    with open(os.path.join(out, f"{scenario}-rank{dist.get_rank()}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


def run_scenario(model_dir: Path, scenario: str, out: Path) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    layout, replicas, _, _ = SCENARIOS[scenario]
    processes = len(layout) * replicas
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", f"--master_port={port}"]
    command += [__file__, "--worker", str(model_dir), scenario, str(out)]
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if run.returncode:
        raise SystemExit(f"{scenario} failed:\n{run.stderr[-3000:]}")
    return [json.loads((out / f"{scenario}-rank{r}.json").read_text()) for r in range(processes)]


def summarize(scenario: str, ranks: list[dict], reference: list[dict]) -> dict:
    """Each process's peak against its share, above the same process of the reference job (`PRESETS["reference"]`)."""
    mb = 2**20
    rows = []
    for rank, (r, ref) in enumerate(zip(ranks, reference, strict=True)):
        base = ref["peak"] - ref["share"]  # the process without its weights
        above = r["peak"] - base
        rows.append({**r, "rank": rank, "base": base, "above_base": above, "ratio_to_share": above / r["share"]})
        print(
            f"{scenario:15s} rank {rank}: peak {r['peak'] / mb:7.0f} MB = base {base / mb:5.0f} MB + {above / mb:7.0f} "
            f"MB; share {r['share'] / mb:7.0f} MB, ratio {above / r['share']:5.2f}; whole {r['whole'] / mb:6.0f} MB"
        )
        if "reduce_scattered_bytes_per_step" in r:
            sent = r["reduce_scattered_bytes_per_step"]
            every, once = sent["every micro-batch"] / mb, sent["once"] / mb
            print(f"{'':15s}   reduce-scattered per step: {every:.1f} MB after every micro-batch, {once:.1f} MB once")
    total = sum(r["peak"] for r in ranks)
    print(f"{scenario:15s} job total {total / mb:.0f} MB", flush=True)
    return {"scenario": scenario, "ranks": rows, "total_peak": total}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(*sys.argv[2:5])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="1b")
    parser.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--out", type=Path, default=Path("output/stage_memory"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir, reference_dir = args.out / f"llama-{args.preset}", args.out / "llama-reference"
    write_model(model_dir, args.preset)
    write_model(reference_dir, "reference")
    results = []
    for name in args.scenarios:
        reference = run_scenario(reference_dir, name, args.out / "reference")
        results.append(summarize(name, run_scenario(model_dir, name, args.out), reference))
    one_whole = [max(r["peak"] for r in res["ranks"]) for res in results if res["scenario"].startswith("whole")]
    for res in results:
        if res["scenario"].startswith("stage") and one_whole:
            print(f"{res['scenario']}: job total / one whole-model process = {res['total_peak'] / max(one_whole):.2f}")
    (args.out / "stage_memory.json").write_text(json.dumps({"preset": args.preset, "results": results}, indent=1))


if __name__ == "__main__":
    main()
