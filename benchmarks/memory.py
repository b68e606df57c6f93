"""Activation memory of recomputation and of the serialized (chunked) projection + loss, on any device.

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
from optimum_ipu.runtime.serialization import chunked_cross_entropy, saved_activation_bytes


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
        hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
        intermediate_size=4 * args.hidden, vocab_size=args.vocab, max_position_embeddings=max(512, args.seq),
    )  # fmt: skip
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

    tokens = args.batch * args.seq
    hidden = torch.randn(tokens, args.hidden, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(args.vocab, args.hidden))  # parameters are not activations
    labels = torch.randint(0, args.vocab, (tokens,))
    full = saved_activation_bytes(
        lambda: torch.nn.functional.cross_entropy(torch.nn.functional.linear(hidden, weight), labels)
    )
    chunked = saved_activation_bytes(lambda: chunked_cross_entropy(hidden, weight, None, labels, chunks=args.chunks))
    print(f"Output projection + loss, {tokens} tokens x vocab {args.vocab}")
    print(f"  {'full logits':36s} {full / 2**20:10.1f} MiB saved for backward")
    print(f"  {f'{args.chunks} chunks (serialized)':36s} {chunked / 2**20:10.1f} MiB saved for backward")


if __name__ == "__main__":
    main()
