"""One layout of `benchmarks/tensor_parallel.py` in this process (every process of the layout runs it):

    python benchmarks/tensor_parallel_worker.py MODE MODEL LAYOUT STEPS OUT_DIR            # one process
    python -m torch.distributed.run --nproc_per_node 2 benchmarks/tensor_parallel_worker.py MODE MODEL LAYOUT ...

MODE `memory`: one AdamW step (per-device batch 1, sequence 128, no accumulation); every rank writes
OUT_DIR/{LAYOUT}-rank{RANK}.json with its resident memory after the imports and before the model is built (`bare`,
bytes) and its peak over the whole run (`peak`, `ru_maxrss`), the parameter bytes it holds after the split and the
whole model's. MODE `steps`: STEPS optimizer steps of per-device batch 2 x 4 micro-batches, each timed on rank 0 by a
`TrainerCallback`, which writes OUT_DIR/{LAYOUT}-rank0.json. The model and its presets, the layouts and the shapes of
a step are here, so that the driver and the workers read the same ones.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

SEQ_LEN = 128
VOCAB = 32000
MODELS = {  # LlamaConfig fields besides the vocabulary (32,000, untied: an embedding and an output projection)
    # 1.03 B parameters: TinyLlama-1.1B's layer (2048 / 5632, 32 heads, 4 query heads per kv head) x 20 layers
    # (16 of them make 0.85 B)
    "llama-1b": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 20,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "llama-8x1024": {  # 160 M parameters
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
    },
    "llama-tiny": {  # for checking the script, not for figures
        "hidden_size": 128,
        "intermediate_size": 352,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    },
}
LAYOUTS = {  # processes, and IPUConfig fields besides the mode's gradient accumulation
    "one": {"processes": 1, "config": {}},
    "tp2": {"processes": 2, "config": {"tensor_parallel_size": 2}},
    "pp2": {"processes": 2, "config": {"ipus_per_replica": 2}},  # layers_per_ipu: half the layers each
}
MODES = {  # per-device batch and micro-batches per optimizer step (the same samples a step in every layout)
    "memory": {"batch": 1, "accumulation": 1, "layouts": ["one", "tp2"]},
    "steps": {"batch": 2, "accumulation": 4, "layouts": ["one", "tp2", "pp2"]},
}


def resident_bytes() -> int:
    """This process's resident memory now (`/proc/self/statm`)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def peak_resident_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def model_config(model: str) -> dict:
    return {"vocab_size": VOCAB, **MODELS[model]}


def layout_config(layout: str, mode: str, layers: int) -> dict:
    """The IPUConfig fields of `layout` in `mode`."""
    fields = {**LAYOUTS[layout]["config"], "gradient_accumulation_steps": MODES[mode]["accumulation"]}
    if fields.get("ipus_per_replica", 1) > 1:
        fields["layers_per_ipu"] = [layers // 2, layers - layers // 2]
    return fields


def step_times(base: type) -> object:
    """A `TrainerCallback` (`base`) holding the wall-clock seconds of each optimizer step, `on_step_begin` to
    `on_step_end`."""

    class StepTimes(base):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.started = 0.0

        def on_step_begin(self, args, state, control, **kwargs) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs) -> None:
            self.seconds.append(time.perf_counter() - self.started)

    return StepTimes()


def main(mode: str, model_name: str, layout: str, steps: int, out: Path) -> None:
    import datasets
    import torch
    import transformers

    from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
    from optimum_ipu.runtime.fsdp import local_parameter_bytes

    torch.set_num_threads(1)
    bare = resident_bytes()  # torch, transformers and optimum_ipu imported; no model, no process group yet
    batch, accumulation = MODES[mode]["batch"], MODES[mode]["accumulation"]
    config = transformers.LlamaConfig(
        **model_config(model_name),
        max_position_embeddings=SEQ_LEN,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    fields = layout_config(layout, mode, config.num_hidden_layers)
    rows = batch * accumulation * steps
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (rows, SEQ_LEN), generator=generator).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    args = IPUTrainingArguments(  # under torchrun, makes the process group
        output_dir=str(out / f"{layout}-trainer"),
        per_device_train_batch_size=batch,
        max_steps=steps,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        bf16=False,
        seed=0,
        ddp_timeout=1800,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)  # whole and fp32 in every process; the trainer splits it
    whole = local_parameter_bytes(model.parameters())
    parameters = sum(p.numel() for p in model.parameters())
    times = step_times(transformers.TrainerCallback)
    trainer = IPUTrainer(model, IPUConfig(**fields), args, train_dataset=data, callbacks=[times])
    trainer.train()
    rank = trainer.args.process_index
    result = {
        "rank": rank,
        "processes": trainer.args.world_size,
        "ipu_config": fields,
        "optim": getattr(trainer.args.optim, "value", str(trainer.args.optim)),
        "parameters": parameters,
        "whole_parameter_bytes": whole,
        "held_parameter_bytes": local_parameter_bytes(trainer.model.parameters()),
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }
    if mode == "memory":
        result |= {"bare": bare, "peak": peak_resident_bytes()}
    else:
        result |= {"step_seconds": times.seconds, "samples_per_step": batch * accumulation}
    if mode == "memory" or rank == 0:
        (out / f"{layout}-rank{rank}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    mode_, model_, layout_, steps_, out_ = sys.argv[1:6]
    main(mode_, model_, layout_, int(steps_), Path(out_))
