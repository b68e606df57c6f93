"""`pipeline()` across stages: a model whose stages run on separate processes, each loaded stage-local under torchrun,
answers every process's call with the results of the whole model in one process (the batch split into micro-batches,
several in flight through the stages, the last stage's output sent back to each process)."""

from __future__ import annotations

import json

import pytest

from optimum_ipu.pipelines import pipeline

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch
from .pipeline_stages_worker import INPUTS

WORKER = str(REPO_ROOT / "tests" / "distributed" / "pipeline_stages_worker.py")


def rounded(value, places: int = 4):
    """Scores rounded (the stages run the same arithmetic in another order of micro-batches)."""
    if isinstance(value, float):
        return round(value, places)
    if isinstance(value, list):
        return [rounded(v, places) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v, places) for k, v in value.items()}
    return value


@pytest.mark.parametrize(
    ("task", "class_name", "layout"),
    [("text-classification", "BertForSequenceClassification", [1, 3]), ("fill-mask", "BertForMaskedLM", [2, 1, 1])],
    ids=["classification-2-stages", "fill-mask-3-stages"],
)
def test_a_pipeline_across_stages_answers_as_one_process(tmp_path, tiny_pretrained, task, class_name, layout):
    model_dir = tiny_pretrained(class_name)
    args = [str(tmp_path), task, str(model_dir), json.dumps(layout)]
    processes = len(layout)
    run = launch(*TORCHRUN, f"--nproc_per_node={processes}", f"--master_port={free_port()}", WORKER, *args)
    assert run.returncode == 0, run.stderr[-3000:]
    want = pipeline(task, model=str(model_dir), batch_size=2)(INPUTS[task])
    assert len({json.dumps(r) for r in want}) > 1, "identical answers would prove little"
    for rank in range(processes):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())["results"]
        assert rounded(got) == rounded(want), rank  # every process: the one-process answers
