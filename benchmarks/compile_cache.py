"""Time to first step, cold vs warm `executable_cache_dir`: two fresh processes, same config and cache.

    python benchmarks/compile_cache.py [--cache-dir DIR]

Each process builds a small BERT, compiles it through the engine, and times its first training step
(compilation included). The second process finds the graphs of the first in the cache.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch, transformers
from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.runtime.engine import Engine
from optimum_ipu.runtime.step import run_steps
torch.manual_seed(0)
config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=256, vocab_size=1000)
ipu_config = IPUConfig(gradient_accumulation_steps=2, executable_cache_dir=sys.argv[1])
model = to_pipelined(transformers.BertForSequenceClassification(config), ipu_config, parallelize=True)
engine, optimizer = Engine(model, ipu_config, compile=True), torch.optim.AdamW(model.parameters())
batch = {"input_ids": torch.randint(0, 1000, (8, 128)), "labels": torch.zeros(8, dtype=torch.long)}

def step():  # one optimizer step of 2 micro-batches, through the engine's step protocol
    run_steps(engine, optimizer, batch, micro_batches=2)

t1 = time.perf_counter()
step()
t2 = time.perf_counter()
step()
t3 = time.perf_counter()
print(json.dumps({"first_step_s": t2 - t1, "second_step_s": t3 - t2, "setup_s": t1 - t0}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache-dir", default=None, help="defaults to a new temporary folder")
    args = parser.parse_args()
    cache = args.cache_dir or tempfile.mkdtemp(prefix="optimum-ipu-cache-")
    runs = []
    for label in ("cold", "warm"):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, cache], capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["process_s"] = time.perf_counter() - start
        runs.append(result)
        print(f"{label}: first step {result['first_step_s']:.1f} s (steady step {result['second_step_s']:.2f} s)")
    print(f"warm / cold time to first step: {runs[1]['first_step_s'] / runs[0]['first_step_s']:.0%} (cache: {cache})")


if __name__ == "__main__":
    main()
