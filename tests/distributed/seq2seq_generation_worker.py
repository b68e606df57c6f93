"""`generate()` of an encoder-decoder model whose stages run on separate processes, for
tests/distributed/test_generation_seq2seq_stages.py.

    torchrun --nproc_per_node N seq2seq_generation_worker.py OUT_DIR MODEL_DIR LAYERS_PER_IPU_JSON INPUTS_PT

Each process loads its stage only (`optimum_ipu.AutoModelForSeq2SeqLM` or `AutoModelForSpeechSeq2Seq`
`.from_pretrained(..., ipu_config=...)` under torchrun), then runs every case of `CASES` on the inputs saved in
INPUTS_PT (seeded as the test seeds its one-process run). Every rank writes OUT_DIR/rank{r}.json: the tokens of each
case, the parameters it holds and the bytes of its self-attention KV cache per decoder layer.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import transformers

import optimum_ipu
from optimum_ipu import IPUConfig
from optimum_ipu.runtime.fsdp import shard_stages
from optimum_ipu.runtime.stages.hold import stage_hold
from tests.distributed.pipeline_worker import write_rank_record

SEED = 11
CASES: dict[str, dict] = {
    "greedy": {"do_sample": False, "max_new_tokens": 8},
    "beam": {"do_sample": False, "num_beams": 3, "num_return_sequences": 2, "max_new_tokens": 6},
    "sample": {"do_sample": True, "top_k": 20, "temperature": 3.0, "max_new_tokens": 8},
}


def cache_bytes(cache: transformers.Cache) -> list[int]:
    """Per decoder layer of an encoder-decoder KV cache: the bytes its self-attention keys and values hold."""
    layers = cache.self_attention_cache.layers
    held = [(layer.keys, layer.values) if getattr(layer, "is_initialized", False) else () for layer in layers]
    return [sum(t.numel() * t.element_size() for t in pair) for pair in held]


def main() -> None:
    out, model_dir, layout, inputs_file = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo")
    config = transformers.AutoConfig.from_pretrained(model_dir)
    speech = config.model_type == "whisper"
    auto = optimum_ipu.AutoModelForSpeechSeq2Seq if speech else optimum_ipu.AutoModelForSeq2SeqLM
    fsdp = "--fsdp" in sys.argv[5:]  # 2 replicas of the stages, each stage sharded over its replicas
    model = auto.from_pretrained(model_dir, ipu_config=IPUConfig(layers_per_ipu=layout, replication_factor=1 + fsdp))
    if fsdp:
        hold = stage_hold(model.model)
        shard_stages(model.model, hold.cut, [len(r) for r in hold.ranges], hold.mesh)
    inputs = torch.load(inputs_file)
    record: dict = {"tokens": {}, "cache": {}}
    record["held_parameters"] = sum(p.numel() for p in model.model.parameters() if not p.is_meta)
    for name, kwargs in CASES.items():
        # a different state per process: the stages share the last one's (each replica its own last stage's)
        torch.manual_seed(SEED + dist.get_rank() % len(layout))
        output = model.generate(**inputs, return_dict_in_generate=True, cache_implementation="dynamic", **kwargs)
        record["tokens"][name] = output.sequences.tolist()
        record["cache"][name] = cache_bytes(output.cache)
    write_rank_record(out, record)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
