"""Optimum Graphcore's `Pipelined<Class>.from_pretrained_transformers` under `torchrun`, the stages on separate
processes: each process reads only its stage's tensors (`optimum_ipu.models.stage_loading.load_stage`), as
`AutoModelFor*.from_pretrained` does (issue 27, item 1)."""

from __future__ import annotations

import json

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch
from ..tiny_models import tiny_model

WORKER = str(REPO_ROOT / "tests" / "distributed" / "class_names_worker.py")


def test_from_pretrained_transformers_loads_each_stage_in_its_process(tmp_path):
    model = tiny_model("BertForMaskedLM")
    model.save_pretrained(tmp_path / "pretrained")
    run = launch(
        *TORCHRUN,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        WORKER,
        str(tmp_path),
        str(tmp_path / "pretrained"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert {r["class"] for r in ranks} == {"PipelinedBertForMaskedLM"}
    first, last = (set(r["held"]) for r in ranks)
    assert any(".layer.1." in n for n in first) and not any(".layer.2." in n or ".layer.3." in n for n in first)
    assert any(".layer.3." in n for n in last) and not any(".layer.0." in n or ".layer.1." in n for n in last)
    assert first | last == {name for name, _ in model.named_parameters()}, "every parameter held by a stage"
