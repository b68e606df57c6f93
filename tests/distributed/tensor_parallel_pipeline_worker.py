"""`pipeline("text-generation")` of a model split over the processes (`inference_tensor_parallel_size`), for
tests/distributed/test_tensor_parallel.py.

    torchrun --nproc_per_node 2 tensor_parallel_pipeline_worker.py OUT_DIR MODEL_DIR

Every process builds the same pipeline from MODEL_DIR with `IPUConfig(tensor_parallel_size=2)` (the inference twin
follows), so each holds half of every layer, and runs the same call, as every process of a `torchrun` script does; each
writes OUT_DIR/rank{r}.json: the generated texts and whether its model is split. Run as plain `python`, the same script
gives one process's texts (the shares run in turn).
"""

from __future__ import annotations

import json
import os
import sys

import torch

from optimum_ipu import IPUConfig
from optimum_ipu.pipelines import pipeline
from optimum_ipu.runtime.tensor_parallel import is_tensor_parallel

PROMPTS = ["The capital of France is", "Once upon a time", "the movie was"]


def main() -> None:
    out, model_dir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    pipe = pipeline("text-generation", model=model_dir, ipu_config=IPUConfig(tensor_parallel_size=2))
    results = pipe(PROMPTS, do_sample=False, max_new_tokens=6)
    stock = pipe.model.model if hasattr(pipe.model, "model") else pipe.model
    rank = int(os.environ.get("RANK", "0"))
    record = {"texts": [r[0]["generated_text"] for r in results], "split": is_tensor_parallel(stock)}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
