"""Each family's tiny model split over the processes by tensor parallelism, against the whole model in the same
process; launched by tests/distributed/test_tensor_parallel.py under torchrun (gloo).

    python tensor_parallel_worker.py OUT_DIR FAMILY [FAMILY ...]

For each family, every process builds the same seeded model twice: one copy stays whole, the other is split over
the `tp` mesh of every process (`optimum_ipu.models.tensor_parallel_plan` + `runtime.tensor_parallel.parallelize`).
Both run the same batch forward and backward; rank 0 writes OUT_DIR/FAMILY.json with the largest differences of the
loss, of the gradients (each gathered whole) and of greedy generation, and every rank the bytes it holds.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from optimum_ipu import IPUConfig
from optimum_ipu.models.pipelined import PipelinedModel
from optimum_ipu.models.tensor_parallel import tensor_parallel_plan
from optimum_ipu.runtime.host_collectives import HostCollectives
from optimum_ipu.runtime.local_shards import hook_ids, localize
from optimum_ipu.runtime.tensor_parallel import parallelize, step_mixed_groups_tensor_by_tensor, whole

VOCAB, SEQ, ROWS = 128, 12, 3
DECODER = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2}
ATTENTION = {"num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
ENCODER = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "max_position_embeddings": SEQ + 4,  # RoBERTa's positions start after its padding index
}


def tiny(family: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The family's tiny model (seeded, no dropout) and one batch with labels."""
    torch.manual_seed(0)
    ids = torch.randint(3, VOCAB, (ROWS, SEQ))
    if family in ("llama", "mistral", "qwen2"):
        config_class = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig}.get(
            family, transformers.Qwen2Config
        )
        model = transformers.AutoModelForCausalLM.from_config(config_class(**DECODER, **ATTENTION))
        return model, {"input_ids": ids, "labels": ids}
    if family == "bert":
        model = transformers.BertForMaskedLM(transformers.BertConfig(**ENCODER))
        return model, {"input_ids": ids, "labels": ids.masked_fill(ids % 3 != 0, -100)}
    if family == "roberta":
        config = transformers.RobertaConfig(**ENCODER, num_labels=3)
        model = transformers.RobertaForSequenceClassification(config)
        return model, {"input_ids": ids, "labels": torch.tensor([0, 2, 1])}
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, initializer_range=0.5,  # tokens that vary from step to step
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}
    if family == "opt":  # a derived plan: q/k/v/out_proj and fc1/fc2 found by name
        config = transformers.OPTConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=96, num_attention_heads=4,
            word_embed_proj_dim=64, max_position_embeddings=32, dropout=0.0, attention_dropout=0.0,
        )  # fmt: skip
        return transformers.OPTForCausalLM(config), {"input_ids": ids, "labels": ids}
    if family == "xlm-roberta":  # a derived plan: BERT-shaped layers take BERT's split
        config = transformers.XLMRobertaConfig(**ENCODER)
        return transformers.XLMRobertaForMaskedLM(config), {"input_ids": ids, "labels": ids}
    if family == "t5":
        config = transformers.T5Config(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=96,
            num_layers=2,
            num_heads=4,
            dropout_rate=0.0,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=1,
        )
        model = transformers.T5ForConditionalGeneration(config)
        return model, {"input_ids": ids, "labels": ids[:, :7].contiguous()}
    if family == "whisper":
        config = transformers.WhisperConfig(
            vocab_size=VOCAB,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=96,
            decoder_ffn_dim=96,
            num_mel_bins=16,
            max_source_positions=16,
            max_target_positions=32,
            dropout=0.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
        )
        model = transformers.WhisperForConditionalGeneration(config)
        features = torch.randn(ROWS, 16, 32)
        return model, {"input_features": features, "labels": ids[:, :6].contiguous()}
    raise ValueError(family)


def largest_difference(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    return max(float((got[k] - want[k]).abs().max()) for k in want)


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: whole(p.grad) for name, p in model.named_parameters() if p.grad is not None}


ADAM_LR, ADAM_EPS = 1e-2, 1e-3  # the step compared: a first AdamW step moves a weight by lr * g / (|g| + eps)


def held_bytes(model: torch.nn.Module) -> int:
    local = (p.to_local() if hasattr(p, "to_local") else p for p in model.parameters())
    return sum(t.numel() * t.element_size() for t in local)


def compare(family: str, mesh: Any) -> dict[str, Any]:
    reference, batch = tiny(family)
    split = copy.deepcopy(reference)
    parallelize(split, tensor_parallel_plan(PipelinedModel(split, IPUConfig()), mesh.size()), mesh)
    want_loss = reference(**batch).loss
    want_loss.backward()
    got_loss = split(**batch).loss
    got_loss.backward()
    # One fused AdamW step over one group of every parameter (a split model mixes plain tensors and DTensors there).
    # eps far above the gradients' rounding (1e-7): Adam's first step divides each gradient by its own size, so at
    # torch's 1e-8 a gradient that is rounding noise on one side and 0 on the other would move its weight by lr.
    steps = [torch.optim.AdamW(m.parameters(), lr=ADAM_LR, eps=ADAM_EPS, fused=True) for m in (reference, split)]
    mixed_groups = step_mixed_groups_tensor_by_tensor(steps[1])
    for optimizer in steps:
        optimizer.step()
    stepped = {n: whole(p.detach()) for n, p in split.named_parameters()}
    result = {
        "loss": float(want_loss),
        "mixed_groups": mixed_groups,
        "step_difference": max(float((stepped[n] - p).abs().max()) for n, p in reference.named_parameters()),
        "loss_difference": abs(float(got_loss) - float(want_loss)),
        "gradient_difference": largest_difference(gradients(split), gradients(reference)),
        "held_bytes": held_bytes(split),
        "whole_bytes": held_bytes(reference),
        "split_parameters": sum(hasattr(p, "to_local") for p in split.parameters()),
    }
    if family in ("llama", "t5", "gpt2"):  # greedy tokens of the split model are the whole model's
        inputs = {"input_ids": batch["input_ids"][:, :5]}
        settings = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
        with torch.no_grad():
            want = reference.generate(**inputs, **settings)
            got = split.generate(**inputs, **settings)
        result["generated_equal"] = bool(torch.equal(got, want))
        result["generated"] = got.tolist()
    return result


def inference(family: str, mesh: Any, collectives: HostCollectives) -> dict[str, Any]:
    """The split as `pipeline()` and `optimum-ipu serve` decode with it (`split_for_inference`: plain shares and
    shared-memory exchanges, `runtime.local_shards`) against the whole model: the largest difference of its outputs
    (logits, or a classifier's), and whether its greedy tokens are the whole model's."""
    reference, batch = tiny(family)
    split = copy.deepcopy(reference)
    plan = tensor_parallel_plan(PipelinedModel(split, IPUConfig()), mesh.size())
    before = hook_ids(split, plan)
    parallelize(split, plan, mesh)
    localize(split, plan, before, collectives)
    with torch.no_grad():
        want, got = reference(**batch), split(**batch)
    result = {
        "difference": max(float((got[k] - want[k]).abs().max()) for k in ("loss", "logits")),
        "scale": max(float(want[k].abs().max()) for k in ("loss", "logits")),
        "dtensors": sum(isinstance(p, DTensor) for p in split.parameters()),
    }
    if family in ("llama", "t5", "gpt2"):
        inputs = {"input_ids": batch["input_ids"][:, :5]}
        settings = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
        with torch.no_grad():
            result["generated_equal"] = bool(torch.equal(split.generate(**inputs, **settings), reference.generate(
                **inputs, **settings
            )))  # fmt: skip
    return result


def main() -> None:
    out, families = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    rank = dist.get_rank()
    collectives = HostCollectives(mesh.get_group())
    for family in families:
        result = compare(family, mesh)
        result["inference"] = inference(family, mesh, collectives)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result["held_bytes"])
        result["held_bytes_by_rank"] = gathered
        if rank == 0:
            with open(os.path.join(out, f"{family}.json"), "w") as f:
                json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
