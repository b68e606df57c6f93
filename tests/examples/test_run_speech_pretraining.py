"""examples/speech-pretraining/run_pretraining.py: Wav2Vec2 pretraining on the FSDD digits, and its parts.

The collator draws what `transformers`' own functions draw (same numpy seed, same arguments), never on padding;
the Gumbel temperature follows upstream's schedule on the model inside whatever wraps it; a tiny model pretrained
from random weights lowers its contrastive loss; and the same run with its 2 stages on 2 processes (`torchrun`) logs
one process's losses.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from example_utils.speech_pretraining import (
    DataCollatorForWav2Vec2Pretraining,
    GumbelTemperatureCallback,
    gumbel_temperature,
)
from transformers.models.wav2vec2.modeling_wav2vec2 import _compute_mask_indices, _sample_negative_indices

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.runtime.layouts import StagesContainer

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch, run_example, run_flags

SCRIPT_DIR = REPO_ROOT / "examples" / "speech-pretraining"
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "conv_dim": [16, 16, 16],
    "conv_kernel": [10, 8, 4],
    "conv_stride": [5, 4, 4],
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
    "codevector_dim": 16,
    "proj_codevector_dim": 16,
    "num_codevectors_per_group": 16,
    "num_codevector_groups": 2,
    "num_negatives": 10,
    "do_stable_layer_norm": True,
    "feat_extract_norm": "layer",
}


def tiny_pretraining_model() -> transformers.Wav2Vec2ForPreTraining:
    torch.manual_seed(0)
    return transformers.Wav2Vec2ForPreTraining(
        transformers.Wav2Vec2Config(**TINY, mask_time_prob=0.5, mask_time_length=4)
    )


def test_collator_draws_as_transformers_and_never_on_padding():
    model = tiny_pretraining_model()
    extractor = transformers.Wav2Vec2FeatureExtractor(do_normalize=True, return_attention_mask=True)
    rng = np.random.default_rng(0)
    clips = [{"input_values": rng.standard_normal(n).astype(np.float32)} for n in (1600, 900, 400)]
    collator = DataCollatorForWav2Vec2Pretraining(model, extractor, max_length=2000)
    np.random.seed(3)
    batch = collator(clips)
    assert batch["input_values"].shape == (3, 2000)  # static: padded to max_length, not to the longest
    frames = int(model._get_feat_extract_output_lengths(2000))
    assert batch["mask_time_indices"].shape == (3, frames)
    assert batch["sampled_negative_indices"].shape == (3, frames, TINY["num_negatives"])
    # transformers' functions, given the same seed and arguments, draw the same
    np.random.seed(3)
    real = model._get_feature_vector_attention_mask(frames, batch["attention_mask"])
    mask = _compute_mask_indices((3, frames), 0.5, 4, attention_mask=real, min_masks=model.config.mask_time_min_masks)
    negatives = _sample_negative_indices((3, frames), TINY["num_negatives"], mask_time_indices=mask)
    assert np.array_equal(batch["mask_time_indices"].numpy(), mask)
    assert np.array_equal(batch["sampled_negative_indices"].numpy(), negatives)
    # no frame of padding is masked; every masked frame has negatives among its own row's masked frames, not itself
    assert not (batch["mask_time_indices"].bool() & ~real).any()
    for row in range(3):
        masked = set((np.flatnonzero(mask[row]) + row * frames).tolist())
        assert masked, row
        for frame in np.flatnonzero(mask[row]):
            drawn = set(negatives[row, frame].tolist())
            assert drawn <= masked and frame + row * frames not in drawn


def test_gumbel_temperature_follows_upstream_schedule_through_wrappers():
    assert [gumbel_temperature(s, 2.0, 0.5, 0.5) for s in range(4)] == [2.0, 1.0, 0.5, 0.5]
    model = tiny_pretraining_model()
    pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=[1, 1], ipus_per_replica=2), parallelize=True)
    callback = GumbelTemperatureCallback(2.0, 0.5, 0.9)
    state = transformers.TrainerState()
    # the model inside the process pipeline's container, inside the pipelined wrapper, inside a plain container
    for wrapper in (model, pipelined, StagesContainer(model)):
        for step in (0, 3, 40):
            state.global_step = step
            callback.on_step_begin(None, state, None, model=wrapper)
            assert model.quantizer.temperature == pytest.approx(max(2.0 * 0.9**step, 0.5))


def run_flags_for(out, *extra: str) -> list[str]:
    return [
        "--ipu_config_name=./",
        "--model_type",
        "wav2vec2",
        "--config_overrides",
        json.dumps(TINY),
        "--max_duration_in_seconds",
        "0.5",
        "--do_train",
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "2e-3",
        "--gumbel_temperature_decay",
        "0.9",
        *extra,
        *run_flags(out),
    ]


@pytest.fixture(scope="module")
def fsdd_train(shared_data):
    return str(shared_data / "audio" / "fsdd" / "train")


def logged(out) -> list[dict]:
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [entry for entry in history if "contrastive_loss" in entry]


def test_tiny_pretraining_lowers_the_contrastive_loss(tmp_path, fsdd_train):
    out = tmp_path / "one"
    data = ("--train_dir", fsdd_train, "--eval_dir", str(Path(fsdd_train).parent / "test"), "--max_eval_samples", "8")
    flags = run_flags_for(out, *data, "--do_eval", "--max_train_samples", "96", "--max_steps", "12")
    result = run_example(SCRIPT_DIR, "run_pretraining.py", *flags, "--crop_aggression", "0.1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--crop_aggression 0.1 has no effect here" in result.stdout + result.stderr
    logs = logged(out)
    assert len(logs) == 12
    first, last = logs[:3], logs[-3:]
    contrastive = [np.mean([e["contrastive_loss"] for e in part]) for part in (first, last)]
    assert contrastive[1] < contrastive[0] - 0.05, contrastive
    assert all(0 <= e["diversity_loss"] <= 1 for e in logs)
    assert [e["gumbel_temperature"] for e in logs[:3]] == pytest.approx([2.0, 1.8, 1.62])
    assert (out / "pretraining_curves.png").stat().st_size > 0
    # evaluation reports the model's own loss (no labels: the collator's masks and negatives)
    assert np.isfinite(json.loads((out / "eval_results.json").read_text())["eval_loss"])
    reloaded = transformers.Wav2Vec2ForPreTraining.from_pretrained(out)  # the stock layout
    assert reloaded.config.num_hidden_layers == TINY["num_hidden_layers"]


def test_stages_on_two_processes_log_one_process_losses(tmp_path, fsdd_train):
    """The script under torchrun with its 2 stages on 2 processes: the collator's draws agree across processes
    (seeded alike), and the losses and their parts are one process's."""
    args = ("--train_dir", fsdd_train, "--max_train_samples", "32", "--max_steps", "3")
    one = run_example(SCRIPT_DIR, "run_pretraining.py", *run_flags_for(tmp_path / "one", *args))
    assert one.returncode == 0, one.stderr[-3000:]
    script = str(SCRIPT_DIR / "run_pretraining.py")
    two = launch(
        *TORCHRUN,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        script,
        *[
            f.replace("--ipu_config_name=./", f"--ipu_config_name={SCRIPT_DIR}/")
            for f in run_flags_for(tmp_path / "two", *args)
        ],
    )
    assert two.returncode == 0, two.stderr[-3000:]
    want, got = logged(tmp_path / "one"), logged(tmp_path / "two")
    assert len(got) == len(want) == 3
    for key in ("loss", "contrastive_loss", "diversity_loss", "codevector_perplexity", "gumbel_temperature"):
        assert [e[key] for e in got] == pytest.approx([e[key] for e in want], rel=1e-5), key
