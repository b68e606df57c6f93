"""Step time of `IPUTrainer` on 1, 2 and 4 processes (`torchrun`, gloo on CPU or NCCL on GPUs).

    python benchmarks/scaling.py [--steps 12] [--layers 4] [--hidden 256] [--seq 128] [--batch 8]

Layouts, all with the same global batch per optimizer step (micro-batch x accumulation x replicas):
1 process (stages and replicas in turn), 2 replicas, 2 pipeline stages, 2 stages x 2 replicas. Each run trains
a small random BERT for sequence classification; the figure is the median optimizer-step time after the first
(warm-up) step, from `IPUTrainer`'s step timer, and samples per second at that pace. On a machine with fewer
cores than processes the processes share cores: the figures then show the cost of the distributed path, not a
speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LAYOUTS = {
    "1 process": (1, {"replication_factor": 1}),
    "2 replicas": (2, {"replication_factor": 2}),
    "2 stages": (2, {"ipus_per_replica": 2, "layers_per_ipu": [-1, -1]}),
    "2 stages x 2 replicas": (4, {"ipus_per_replica": 2, "layers_per_ipu": [-1, -1], "replication_factor": 2}),
}


def worker(out: str, config_json: str, steps: int, layers: int, hidden: int, seq: int, batch: int) -> None:
    import datasets
    import torch
    import transformers

    from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments

    ipu_config = IPUConfig.from_dict(json.loads(config_json))
    rows = batch * ipu_config.gradient_accumulation_steps * ipu_config.replication_factor * (steps + 1)
    generator = torch.Generator().manual_seed(0)
    data = datasets.Dataset.from_dict(
        {
            "input_ids": torch.randint(1, 1000, (rows, seq), generator=generator).tolist(),
            "labels": torch.randint(0, 2, (rows,), generator=generator).tolist(),
        }
    )
    config = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden,
        max_position_embeddings=seq,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    args = IPUTrainingArguments(
        output_dir=out,
        per_device_train_batch_size=batch,
        max_steps=steps,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=steps,
    )
    trainer = IPUTrainer(transformers.BertForSequenceClassification(config), ipu_config, args, train_dataset=data)
    trainer.train()
    if trainer.args.process_index == 0:
        durations = trainer.step_timer.durations[1:]
        with open(os.path.join(out, "timing.json"), "w") as f:
            json.dump({"median_step_s": statistics.median(durations), "steps": len(durations)}, f)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8, help="micro-batch per process")
    parser.add_argument("--accumulation", type=int, default=4)
    options = parser.parse_args()
    shape = [str(options.steps), str(options.layers), str(options.hidden), str(options.seq), str(options.batch)]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    rows = []
    for name, (processes, fields) in LAYOUTS.items():
        replicas = fields.get("replication_factor", 1)
        # the same global batch for every layout: fewer micro-batches per replica as replicas grow
        config = json.dumps({**fields, "gradient_accumulation_steps": options.accumulation * 2 // replicas})
        with tempfile.TemporaryDirectory() as out:
            launcher = (
                [sys.executable]
                if processes == 1
                else [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    f"--nproc_per_node={processes}",
                    f"--master_port={free_port()}",
                ]
            )
            run = subprocess.run(
                [*launcher, __file__, "--worker", out, config, *shape], env=env, text=True, capture_output=True
            )
            if run.returncode:
                sys.exit(f"{name}: failed\n{run.stderr[-3000:]}")
            timing = json.loads(Path(out, "timing.json").read_text())
        samples = options.batch * options.accumulation * 2
        rows.append(
            {
                "layout": name,
                "processes": processes,
                "median_step_s": round(timing["median_step_s"], 4),
                "samples_per_second": round(samples / timing["median_step_s"], 2),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["median_step_s"]
    print("\n| layout | processes | step (s) | samples/s | step vs 1 process |\n|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['layout']} | {row['processes']} | {row['median_step_s']:.3f} | {row['samples_per_second']:.1f} "
            f"| {row['median_step_s'] / base:.2f}x |"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        out, config_json, *shape = sys.argv[2:]
        worker(out, config_json, *(int(v) for v in shape))
    else:
        main()
