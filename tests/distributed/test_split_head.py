"""The output projection shared by the stages in evaluation (`inference_serialized_projection_splits_per_ipu`,
`optimum_ipu.runtime.stages.head`): with the stages on separate processes under torchrun (gloo), `evaluate()` gives
one process's loss while the last stage never runs the whole projection, the shares as the splits say (even, uneven, a
stage without one); `predict()`, which keeps the logits, runs it whole and gives one process's logits; after training,
the shares are the trained weights."""

from __future__ import annotations

import json

import pytest
import torch

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch
from ..tiny_models import tiny_model
from .split_head_worker import run_case

WORKER = str(REPO_ROOT / "tests" / "distributed" / "split_head_worker.py")

TWO_STAGES = [  # (class, layers_per_ipu, splits, training steps)
    ("LlamaForCausalLM", [2, 2], [1, 1], 2),  # an untied head; evaluated again after training
    ("GPT2LMHeadModel", [1, 3], [3, 1], 0),  # tied to the input embedding; the first stage's share three times larger
    ("BertForMaskedLM", [2, 2], [1, 1], 0),  # the masked kind, a projection with a bias
    ("LlamaForCausalLM", [2, 2], [1, 200], 0),  # the first stage's 1/201 of 99 words is no row: it computes nothing
]
THREE_STAGES = [("LlamaForCausalLM", [1, 2, 1], [0, 1, 2], 0)]  # the first stage holds no share


def cases_of(table, folder) -> list[dict]:
    cases = []
    for i, (class_name, layers, splits, train) in enumerate(table):
        model = folder / f"model{i}"
        tiny_model(class_name).save_pretrained(model)
        cases.append({"class": class_name, "model": str(model), "layers": layers, "splits": splits, "train": train})
    return cases


@pytest.mark.parametrize("table", [TWO_STAGES, THREE_STAGES], ids=["2-stages", "3-stages"])
def test_a_shared_head_evaluates_as_one_process(tmp_path, table):
    cases = cases_of(table, tmp_path)
    processes = len(table[0][1])
    out = tmp_path / "out"
    out.mkdir()
    run = launch(
        *TORCHRUN, f"--nproc_per_node={processes}", f"--master_port={free_port()}", WORKER, str(out), json.dumps(cases)
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for i, case in enumerate(cases):
        want = run_case(case, str(tmp_path / f"one{i}"), stages=False)
        ranks = [json.loads((out / f"{i}-rank{r}.json").read_text()) for r in range(processes)]
        last = ranks[-1]
        for rank in ranks:  # every process reports the replica's loss
            assert rank["eval_loss"] == pytest.approx(want["eval_loss"], abs=1e-5), case["class"]
        assert last["evaluate_calls"] == 0  # the shares computed the loss: the whole projection never ran
        assert last["predict_calls"] > 0  # the logits were kept: it ran whole on the last stage
        torch.testing.assert_close(torch.tensor(last["logits"]), torch.tensor(want["logits"]), atol=1e-5, rtol=0)
        if case["train"]:
            assert last["trained_eval_loss"] == pytest.approx(want["trained_eval_loss"], abs=1e-5)
            assert last["trained_eval_loss"] != pytest.approx(last["eval_loss"], abs=1e-3)  # the weights moved
