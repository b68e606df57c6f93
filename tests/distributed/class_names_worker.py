"""Optimum Graphcore's `Pipelined<Class>.from_pretrained_transformers` with the stages on separate processes, for
tests/distributed/test_class_names_stages.py.

    torchrun --nproc_per_node 2 class_names_worker.py OUT_DIR MODEL_DIR

Each process loads a tiny `BertForMaskedLM` folder through `PipelinedBertForMaskedLM` with `layers_per_ipu=[2, 2]`
and writes OUT_DIR/rank{r}.json: its class, and the parameters it holds (not on the meta device).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from optimum_ipu import IPUConfig


def main() -> None:
    # a module made from the registry, not a file: import linters take it for a third-party one
    from optimum_ipu.models.bert import PipelinedBertForMaskedLM

    out, model_dir = sys.argv[1:3]
    dist.init_process_group("gloo")
    pipelined = PipelinedBertForMaskedLM.from_pretrained_transformers(model_dir, IPUConfig(layers_per_ipu=[2, 2]))
    held = sorted(name for name, param in pipelined.model.named_parameters() if not param.is_meta)
    result = {"class": type(pipelined).__name__, "held": held}
    (Path(out) / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
