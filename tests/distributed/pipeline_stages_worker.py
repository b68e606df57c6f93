"""`pipeline()` of a model whose stages run on separate processes, for tests/distributed/test_pipeline_stages.py.

    torchrun --nproc_per_node N pipeline_stages_worker.py OUT_DIR TASK MODEL_DIR LAYERS_PER_IPU_JSON

Each process loads its stage only (`optimum_ipu`'s auto class for the task, under torchrun), builds the task's pipeline
and runs it on `INPUTS[TASK]` (every process, the same inputs); every rank writes OUT_DIR/rank{r}.json with the results.
"""

from __future__ import annotations

import json
import os
import sys

import optimum_ipu
from optimum_ipu import IPUConfig, IPUTrainingArguments
from optimum_ipu.pipelines import pipeline
from optimum_ipu.runtime.stages.hold import stage_hold

INPUTS = {
    "text-classification": ["the movie was great", "a dull, long and tiring film", "fine", "not bad at all", "meh"],
    "fill-mask": ["the capital of france is [MASK].", "a [MASK] day"],
}
AUTO = {"text-classification": "AutoModelForSequenceClassification", "fill-mask": "AutoModelForMaskedLM"}


def main() -> None:
    out, task, model_dir, layout = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    IPUTrainingArguments(output_dir=out, ddp_timeout=60)  # the gloo process group, as the scripts make it
    config = IPUConfig(layers_per_ipu=layout, ipus_per_replica=len(layout))
    model = getattr(optimum_ipu, AUTO[task]).from_pretrained(model_dir, ipu_config=config)
    assert stage_hold(model.model) is not None  # each process holds its stage only
    runner = pipeline(task, model=model, tokenizer=model_dir, batch_size=2)
    results = runner(INPUTS[task])
    with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump({"results": results}, f)


if __name__ == "__main__":
    main()
