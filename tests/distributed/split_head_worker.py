"""Evaluation through pipeline stages on processes with the output projection shared by the stages
(`inference_serialized_projection_splits_per_ipu`), for tests/distributed/test_split_head.py.

    torchrun --nproc_per_node N split_head_worker.py OUT CASES_JSON

CASES_JSON is a list of cases, each `{"class": CLASS, "model": FOLDER, "layers": [...], "splits": [...], "train":
STEPS}`: the tiny model saved in FOLDER, loaded stage by stage (`load_stage`), evaluated (`evaluate()`: the loss
alone), asked for its logits (`predict()`), and, with STEPS > 0, trained that many steps and evaluated again. For case
i every rank writes OUT/{i}-rank{r}.json (`run_case`'s record). `run_case(case, stages=False)` runs the same in one
process, the model whole (the test's reference).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import datasets
import torch
import transformers

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.models.stage_loading import load_stage
from tests.tiny_models import tiny_inputs

ROWS = 12  # 6 evaluation batches of 2


def rows_of(class_name: str, seed: int) -> datasets.Dataset:
    inputs = tiny_inputs(class_name, batch=ROWS, seed=seed)
    return datasets.Dataset.from_dict({k: v.tolist() for k, v in inputs.items()})


def count_calls(module: torch.nn.Module) -> dict[str, int]:
    calls = {"n": 0}
    module.register_forward_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    return calls


def run_case(case: dict[str, Any], out: str, stages: bool = True) -> dict[str, Any]:
    """One case (the module docstring): the evaluation losses, the output projection's calls on this process during
    the loss-only evaluation and during `predict()`, and the predicted logits."""
    layout = {"layers_per_ipu": case["layers"], "ipus_per_replica": len(case["layers"])} if stages else {}
    if stages:
        layout["inference_serialized_projection_splits_per_ipu"] = case["splits"]
    config = IPUConfig(gradient_accumulation_steps=len(case["layers"]), **layout)
    auto = "AutoModelForMaskedLM" if case["class"].endswith("MaskedLM") else "AutoModelForCausalLM"
    if stages:
        model = load_stage(auto, case["model"], config).model
    else:
        model = getattr(transformers, case["class"]).from_pretrained(case["model"])
    args = IPUTrainingArguments(
        output_dir=out,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        max_steps=case["train"] or 1,
        learning_rate=1e-2,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=3,
    )
    data = rows_of(case["class"], seed=1)
    trainer = IPUTrainer(model, config, args, train_dataset=rows_of(case["class"], seed=2), eval_dataset=data)
    calls = count_calls(trainer.model.get_output_embeddings())
    record: dict[str, Any] = {"eval_loss": trainer.evaluate()["eval_loss"], "evaluate_calls": calls["n"]}
    calls["n"] = 0
    logits = trainer.predict(data).predictions
    record |= {"predict_calls": calls["n"], "logits": torch.as_tensor(logits).tolist()}
    if case["train"]:
        trainer.train()
        record["trained_eval_loss"] = trainer.evaluate()["eval_loss"]
    return record


def main() -> None:
    out, cases = sys.argv[1], json.loads(sys.argv[2])
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    for i, case in enumerate(cases):
        record = run_case(case, os.path.join(out, str(i)))
        with open(os.path.join(out, f"{i}-rank{rank}.json"), "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    main()
