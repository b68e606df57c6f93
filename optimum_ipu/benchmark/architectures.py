"""The models `optimum-ipu benchmark` builds (named architectures, random weights: nothing is downloaded), the
batches they take and their FLOPs counts, shared by every runner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

# name -> config factory
ARCHITECTURES: dict[str, Callable[[], transformers.PretrainedConfig]] = {
    "bert-base-uncased-config": lambda: transformers.BertConfig(),
    "bert-large-uncased-config": lambda: transformers.BertConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    ),
    "gpt2-config": lambda: transformers.GPT2Config(),
    # t5-small's special tokens (transformers 5's T5Config() leaves decoder_start_token_id unset)
    "t5-small-config": lambda: transformers.T5Config(decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
    "tiny-bert-config": lambda: transformers.BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256
    ),
    "tiny-gpt2-config": lambda: transformers.GPT2Config(n_embd=128, n_layer=2, n_head=2, vocab_size=1000),
    "tiny-t5-config": lambda: transformers.T5Config(
        d_model=128, d_ff=256, num_layers=2, num_heads=2, vocab_size=1000, decoder_start_token_id=0, pad_token_id=0
    ),
}
# task -> the `transformers` auto class of its model
TASKS = {
    "question-answering": "AutoModelForQuestionAnswering",
    "causal-lm": "AutoModelForCausalLM",
    "translation": "AutoModelForSeq2SeqLM",
}


def make_model(name: str, task: str, seed: int = 0) -> torch.nn.Module:
    """A model of architecture `name` (`ARCHITECTURES`) with the head of `task` (`TASKS`), random weights drawn
    with `seed` (the same in every runner)."""
    torch.manual_seed(seed)
    config = ARCHITECTURES[name]()
    return getattr(transformers, TASKS[task]).from_config(config)


def flops_per_sample(model: torch.nn.Module, config: Any, seq_len: int, training: bool) -> float:
    """Model FLOPs of one sample of `seq_len` tokens, counted by `torch.utils.flop_counter.FlopCounterMode` over one
    forward of a batch of one (and, in training, its backward): every matmul, attention included. For BERT-base QA at
    384 tokens that is 70.7 GFLOP forward and 212 with the backward, the `2 x P x s + 4 x L x h x s^2` (x3) of the
    usual formula."""
    device = next(model.parameters()).device
    ids = torch.zeros(1, seq_len, dtype=torch.long, device=device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids
    with FlopCounterMode(display=False) as counter, torch.set_grad_enabled(training):
        outputs = model(**inputs)
        if training:
            floats = [v for v in outputs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
            torch.stack([v.float().sum() for v in floats]).sum().backward()
    if training:
        model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def synthetic_batches(
    task: str, config: Any, batch_size: int, seq_len: int, count: int, mode: str = "train"
) -> list[dict]:
    """Fixed random batches shared by every runner: with labels for training; for inference only what a
    prediction takes (and `decoder_input_ids` for sequence-to-sequence models, which their forward needs)."""
    g = torch.Generator().manual_seed(0)
    vocab = config.vocab_size
    batches = []
    for _ in range(count):
        ids = torch.randint(0, vocab, (batch_size, seq_len), generator=g)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if mode == "inference":
            if task == "translation":
                # teacher-forced decoder inputs: the labels shifted right behind the start token
                start = torch.full((batch_size, 1), config.decoder_start_token_id)
                batch["decoder_input_ids"] = torch.cat([start, ids[:, :-1]], dim=1)
        elif task == "question-answering":
            batch["start_positions"] = torch.randint(0, seq_len, (batch_size,), generator=g)
            batch["end_positions"] = torch.randint(0, seq_len, (batch_size,), generator=g)
        else:
            batch["labels"] = ids.clone()
        batches.append(batch)
    return batches


__all__ = ["ARCHITECTURES", "TASKS", "make_model", "flops_per_sample", "synthetic_batches"]
