"""Wav2Vec2ForPreTraining with its stages on 2 processes (gloo): the losses and weights of one process.

The contrastive loss on the last stage reads the feature encoder's output besides the last layer's: only the hidden
states travel, the last stage computes the feature encoder's output again, and the feature encoder's gradients of
both stages are summed (`optimum_ipu.models.families.speech`). The masked frames and sampled negatives come with the
batch (`StagePlan.process_stage_inputs`); a batch without them is refused, naming them. The Gumbel noise of the
quantizer is drawn on the last stage only: with the same seed, one process draws the same.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.runtime.engine import Engine
from optimum_ipu.runtime.step import run_steps

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch
from ..tiny_models_vision_speech import tiny_inputs
from .pretraining_stages_worker import pretraining_model

WORKER = str(REPO_ROOT / "tests" / "distributed" / "pretraining_stages_worker.py")
CLASS = "Wav2Vec2ForPreTraining"
CONFIG = {"layers_per_ipu": [1, 3], "gradient_accumulation_steps": 4}
STEPS = 3


def one_process(stable: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same steps with the stages run in turn in one process (the worker's model, batches and seeds)."""
    ipu_config = IPUConfig.from_dict(CONFIG)
    pipelined = to_pipelined(pretraining_model(stable), ipu_config, parallelize=True)
    initial = {k: v.clone() for k, v in pipelined.model.state_dict().items()}
    micro = ipu_config.gradient_accumulation_steps
    engine, sgd = Engine(pipelined, ipu_config), torch.optim.SGD(pipelined.parameters(), lr=0.1)
    batches = [tiny_inputs(CLASS, batch=2 * micro, seed=step) for step in range(STEPS)]
    losses = [float(run_steps(engine, sgd, batch, micro)[-1]) for batch in batches]
    changed = {k: v for k, v in pipelined.model.state_dict().items() if not torch.equal(v, initial[k])}
    return losses, changed


# "stable": the recipes' model (do_stable_layer_norm): the encoder's layer norm runs on the last stage
@pytest.mark.parametrize("layer_norm", ["post", "stable"])
def test_pretraining_stages_on_two_processes_equal_one_process(tmp_path, layer_norm):
    run = launch(
        *TORCHRUN,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        WORKER,
        str(tmp_path),
        json.dumps(CONFIG),
        str(STEPS),
        *(["stable"] if layer_norm == "stable" else []),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # without the negatives each stage would have to draw its own: refused, naming what is missing
    for rank in range(2):
        refused = (tmp_path / f"refused{rank}.txt").read_text()
        assert "needs mask_time_indices and sampled_negative_indices in every batch" in refused
        assert "(missing: sampled_negative_indices)" in refused
    want_losses, want_weights = one_process(layer_norm == "stable")
    got_losses = json.loads((tmp_path / "loss.json").read_text())
    assert got_losses == pytest.approx(want_losses, rel=1e-6)
    assert got_losses[-1] < got_losses[0]  # it trains (the batches differ, the last is still the lowest)
    got = {**load_file(tmp_path / "rank0.safetensors"), **load_file(tmp_path / "rank1.safetensors")}
    assert got.keys() == want_weights.keys()
    # the feature encoder and the quantizer both trained: the loss reached both ends of the model
    assert any(k.startswith("wav2vec2.feature_extractor.") for k in got)
    assert any(k.startswith("quantizer.") for k in got)
    for key, value in want_weights.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)
