"""IPUTrainer resumes from checkpoints that a plain `transformers.Trainer` wrote (no completion marker of ours) as
`Trainer` would, when their files load; a damaged one is still refused (issue 29, item 7)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.trainer.checkpoints import checkpoint_problem, last_complete_checkpoint, resolve_resume

from .helpers import SHORT_RUN, TRAINER_CLASS, classification_dataset
from .tiny_models import tiny_model

# 32 rows, 4 a step, 2 epochs: 16 steps; a checkpoint every 8
COMMON = {**SHORT_RUN, "per_device_train_batch_size": 4, "num_train_epochs": 2, "save_strategy": "steps"}
COMMON["save_steps"] = 8
NO_MARKER = "carries no checkpoint_complete.json"


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def stock_run(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A plain `transformers.Trainer` run of 16 steps: its output folder (checkpoint-8, checkpoint-16) and final
    weights, those of the uninterrupted run."""
    out = tmp_path_factory.mktemp("stock")
    trainer = transformers.Trainer(
        tiny_model(TRAINER_CLASS),
        transformers.TrainingArguments(str(out), **COMMON),
        train_dataset=classification_dataset(32),
    )
    trainer.train()
    assert {p.name for p in out.glob("checkpoint-*")} == {"checkpoint-8", "checkpoint-16"}
    return out, weights(trainer.model)


@pytest.fixture
def interrupted(stock_run, tmp_path) -> Path:
    """An output folder as the stock run left it had it been killed after its step-8 checkpoint."""
    out = tmp_path / "run"
    shutil.copytree(stock_run[0] / "checkpoint-8", out / "checkpoint-8")
    return out


@pytest.mark.parametrize("how", ["True", "path"])
def test_ipu_trainer_resumes_a_trainer_checkpoint_as_uninterrupted(stock_run, interrupted, caplog, how):
    resume = True if how == "True" else str(interrupted / "checkpoint-8")
    args = IPUTrainingArguments(str(interrupted), **COMMON)
    model, train = tiny_model(TRAINER_CLASS, seed=99), classification_dataset(32)
    resumed = IPUTrainer(model, IPUConfig(), args, train_dataset=train)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        resumed.train(resume_from_checkpoint=resume)
    said = [r.getMessage() for r in caplog.records if NO_MARKER in r.getMessage()]
    assert len(said) == 1 and "checkpoint-8" in said[0] and "\n" not in said[0], said
    assert resumed.state.global_step == 16
    for key, value in stock_run[1].items():
        torch.testing.assert_close(weights(resumed.model)[key], value, atol=1e-5, rtol=0, msg=key)
    # what it saved after the resume is marked as ours, and is the newest whole checkpoint
    assert last_complete_checkpoint(str(interrupted)) == str(interrupted / "checkpoint-16")


def _truncate(path: Path, keep: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep])


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damaged", "damage"),
    [
        ("model.safetensors", lambda p: _truncate(p, p.stat().st_size - 100)),
        ("optimizer.pt", _flip_middle_byte),
        ("optimizer.pt", lambda p: _truncate(p, p.stat().st_size // 2)),
        ("trainer_state.json", lambda p: _truncate(p, 20)),
    ],
)
def test_a_damaged_trainer_checkpoint_is_refused(interrupted, damaged, damage):
    checkpoint = interrupted / "checkpoint-8"
    damage(checkpoint / damaged)
    problem = checkpoint_problem(str(checkpoint))
    assert problem is not None and problem.startswith(f"{damaged} does not load"), problem
    with pytest.raises(ValueError, match=f"cannot resume from it \\({damaged} does not load"):
        resolve_resume(str(checkpoint), str(interrupted))
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resolve_resume(True, str(interrupted))


def test_true_skips_a_damaged_newest_trainer_checkpoint_for_a_whole_older_one(stock_run, interrupted, caplog):
    newest = interrupted / "checkpoint-16"
    shutil.copytree(stock_run[0] / "checkpoint-16", newest)
    _truncate(newest / "model.safetensors", 1000)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        chosen = resolve_resume(True, str(interrupted))
    assert chosen == str(interrupted / "checkpoint-8")
    assert "checkpoint-16 (model.safetensors does not load" in caplog.text and NO_MARKER in caplog.text


def test_an_unmarked_folder_of_ours_is_still_a_save_cut_short(interrupted):
    """An unmarked folder with `ipu_config.json` is IPUTrainer's, killed before its marker: never taken as a
    `Trainer` checkpoint, however whole its files look."""
    checkpoint = interrupted / "checkpoint-8"
    IPUConfig().save_pretrained(checkpoint)
    assert checkpoint_problem(str(checkpoint)) == "no completion marker: a save cut short"
    assert last_complete_checkpoint(str(interrupted)) is None
