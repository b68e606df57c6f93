"""Activation memory of recomputation and of the serialized (chunked) output projection + loss.

Counts the bytes of tensors saved for backward (`saved_activation_bytes`): deterministic on a CPU, where
the allocator has no peak counter. On CUDA it also reports `torch.cuda.max_memory_allocated`.

    python benchmarks/memory.py [--layers 4] [--hidden 256] [--seq 384] [--batch 4] [--vocab 30522]
"""

from __future__ import annotations

import argparse
import copy

import torch
import transformers

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.runtime.serialization import saved_activation_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=384)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--chunks", type=int, default=8)
    args = parser.parse_args()

    config = transformers.BertConfig(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        intermediate_size=4 * args.hidden,
        vocab_size=args.vocab,
        max_position_embeddings=max(512, args.seq),
    )
    torch.manual_seed(0)
    stock = transformers.BertForQuestionAnswering(config).train()
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    batch = {"input_ids": ids, "start_positions": torch.zeros(args.batch, dtype=torch.long)}
    batch["end_positions"] = batch["start_positions"]

    results = {}
    for name, ipu_config in {
        "no recompute": IPUConfig(layers_per_ipu=[-1]),
        "recompute_checkpoint_every_layer": IPUConfig(layers_per_ipu=[-1], recompute_checkpoint_every_layer=True),
    }.items():
        model = to_pipelined(copy.deepcopy(stock), ipu_config, parallelize=True).train()
        results[name] = saved_activation_bytes(lambda m=model: m(**batch).loss)
    print(f"BertForQuestionAnswering, {args.layers} layers, hidden {args.hidden}, batch {args.batch} x seq {args.seq}")
    for name, value in results.items():
        print(f"  {name:36s} {value / 2**20:10.1f} MiB saved for backward")
    print(f"  recompute keeps {results['recompute_checkpoint_every_layer'] / results['no recompute']:.1%} of it")

    gpt2 = transformers.GPT2Config(
        n_embd=args.hidden,
        n_layer=args.layers,
        n_head=max(1, args.hidden // 64),
        n_positions=max(1024, args.seq),
        vocab_size=50257,
    )
    torch.manual_seed(0)
    lm = transformers.GPT2LMHeadModel(gpt2).train()
    ids = torch.randint(0, 50257, (args.batch, args.seq))
    shape = f"batch {args.batch} x seq {args.seq}"
    print(f"GPT2LMHeadModel, {args.layers} layers, hidden {args.hidden}, vocab 50,257, {shape}")
    for factor in (1, args.chunks):
        model = to_pipelined(copy.deepcopy(lm), IPUConfig(projection_serialization_factor=factor), parallelize=True)
        saved = saved_activation_bytes(lambda m=model: m.train()(input_ids=ids, labels=ids).loss)
        print(f"  {f'projection_serialization_factor={factor}':36s} {saved / 2**20:10.1f} MiB saved for backward")


if __name__ == "__main__":
    main()
