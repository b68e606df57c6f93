"""A resume continues exactly the run that was interrupted, or refuses with one line saying why.

Generated cases: every file of a real checkpoint, missing, truncated or changed by one byte, is named and the
checkpoint skipped for the previous whole one (or refused when asked for by path); each argument that shapes
training, changed between the run and its resume, is refused by name; an earlier run's checkpoints never win
over this run's; a folder rewritten in place loses its marker first.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import datasets
import pytest
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments, last_complete_checkpoint
from optimum_ipu.trainer.checkpoints import COMPLETE_MARKER, checkpoint_problem, is_complete, read_marker

from ..tiny_models import tiny_inputs, tiny_model

CLASS = "BertForSequenceClassification"
STEPS = 6  # 24 rows, micro-batches of 2, 2 per step; a checkpoint every 2 steps


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread for these tiny models: on a small shared machine more threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def dataset(rows: int = 2 * 2 * STEPS) -> datasets.Dataset:
    data = tiny_inputs(CLASS, batch=rows, seed=0)
    return datasets.Dataset.from_dict({k: v.tolist() for k, v in data.items()})


def trainer_for(
    out: Path,
    rows: int = 2 * 2 * STEPS,
    config: IPUConfig | None = None,
    callbacks: list | None = None,
    model: torch.nn.Module | None = None,
    **kwargs,
) -> IPUTrainer:
    options = {
        "per_device_train_batch_size": 2,
        "num_train_epochs": 1,
        "learning_rate": 1e-3,
        "seed": 5,
        "save_strategy": "steps",
        "save_steps": 2,
        "report_to": [],
        "disable_tqdm": True,
        **kwargs,
    }
    args = IPUTrainingArguments(output_dir=str(out), **options)
    return IPUTrainer(
        model if model is not None else tiny_model(CLASS),
        config or IPUConfig(gradient_accumulation_steps=2),
        args,
        train_dataset=dataset(rows),
        callbacks=callbacks,
    )


def weights(trainer: IPUTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """An uninterrupted run: its checkpoints (2, 4, 6) and final weights. Tests copy the folder before harming it."""
    out = tmp_path_factory.mktemp("finished") / "out"
    trainer = trainer_for(out)
    trainer.train()
    return out, weights(trainer)


def copy_run(finished_run, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(finished_run[0], out)
    return out


CORRUPTIONS = ("missing", "truncated", "one byte changed", "grown")


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "grown":
        path.write_bytes(data + b"\0")
    else:  # same size: only the hash can tell
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damaged_file_is_named_and_the_previous_checkpoint_used(finished_run, tmp_path_factory, data, reliability):
    out = copy_run(finished_run, tmp_path_factory.mktemp("damaged"))
    newest = out / "checkpoint-6"
    name = data.draw(st.sampled_from(sorted(read_marker(str(newest))["files"])), label="file")
    how = data.draw(st.sampled_from(CORRUPTIONS), label="corruption")
    corrupt(newest / name, how)
    reliability.fault_injected()
    problem = checkpoint_problem(str(newest))
    assert problem is not None and problem.startswith(name), problem
    assert last_complete_checkpoint(str(out)) == str(out / "checkpoint-4")  # skipped for the previous whole one
    reliability.checkpoint_verified()
    reliability.expect_clear_error(
        lambda: trainer_for(out).train(resume_from_checkpoint=str(newest)), ("checkpoint-6", name)
    )  # asked for by path: refused, naming the file
    reliability.fault_survived()


def test_resume_skips_a_truncated_optimizer_and_ends_as_uninterrupted(finished_run, tmp_path, reliability, caplog):
    """The issue's case: `optimizer.pt` truncated in the newest checkpoint resumed with fresh state, exit 0. Now the
    resume names it, goes on from the previous checkpoint, and ends with the uninterrupted run's weights."""
    out = copy_run(finished_run, tmp_path)
    shutil.rmtree(out / "checkpoint-6")  # as if killed after step 5
    corrupt(out / "checkpoint-4" / "optimizer.pt", "truncated")
    reliability.fault_injected()
    trainer = trainer_for(out)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        trainer.train(resume_from_checkpoint=True)
    assert "checkpoint-4 (optimizer.pt has" in caplog.text, caplog.text
    for key, value in finished_run[1].items():
        torch.testing.assert_close(weights(trainer)[key], value, atol=1e-6, rtol=0, msg=key)
    reliability.fault_survived()


# Each argument that shapes training, changed between a run and its resume: (IPUTrainingArguments, IPUConfig, rows)
CHANGES = {
    "learning_rate": ({"learning_rate": 2e-3}, None, None),
    "seed": ({"seed": 6}, None, None),
    "per_device_train_batch_size": ({"per_device_train_batch_size": 1}, None, None),
    "weight_decay": ({"weight_decay": 0.1}, None, None),
    "lr_scheduler_type": ({"lr_scheduler_type": "constant"}, None, None),
    "warmup_steps": ({"warmup_ratio": 0.5}, None, None),
    "max_grad_norm": ({"max_grad_norm": 0.5}, None, None),
    "lamb": ({"lamb": True}, None, None),
    "gradient_accumulation_steps": ({}, IPUConfig(gradient_accumulation_steps=3), None),
    "replication_factor": ({}, IPUConfig(gradient_accumulation_steps=2, replication_factor=2), None),
    "train_samples": ({}, None, 20),
    "lr_scheduler_kwargs": (
        {"lr_scheduler_type": "cosine_with_restarts", "lr_scheduler_kwargs": {"num_cycles": 3}},
        None,
        None,
    ),
}


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_resume_with_other_training_arguments_is_refused_naming_them(finished_run, tmp_path, field, reliability):
    out = copy_run(finished_run, tmp_path)
    kwargs, config, rows = CHANGES[field]
    trainer = trainer_for(out, rows=rows or 2 * 2 * STEPS, config=config, **kwargs)
    before = weights(trainer)
    reliability.expect_clear_error(lambda: trainer.train(resume_from_checkpoint=True), ("checkpoint-6", field))
    assert trainer.state.global_step == 0 and all(torch.equal(v, weights(trainer)[k]) for k, v in before.items())


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("num_hidden_layers", 3, "model.num_hidden_layers"),
        ("hidden_act", "relu", "model.hidden_act"),
        ("num_labels", 2, "model.id2label"),
    ],
)
def test_resume_into_another_architecture_is_refused_naming_it(finished_run, tmp_path, key, value, named, reliability):
    """A model with fewer layers lost the checkpoint's extra ones without a word; a wider one stopped in a raw
    size mismatch: the architecture is part of the run (issue 42, item 2)."""
    out = copy_run(finished_run, tmp_path)
    model = tiny_model(CLASS)
    config = model.config.to_dict() | {key: value}
    config.pop("id2label", None) if key == "num_labels" else None
    other = type(model)(type(model.config).from_dict(config))
    trainer = trainer_for(out, model=other)
    reliability.expect_clear_error(lambda: trainer.train(resume_from_checkpoint=True), ("checkpoint-6", named))
    assert trainer.state.global_step == 0


def test_resume_for_longer_is_said_in_a_warning(finished_run, tmp_path, reliability, caplog):
    """Training on for more epochs (or steps) is allowed, as in transformers, with a warning naming the change."""
    out = copy_run(finished_run, tmp_path)
    trainer = trainer_for(out, num_train_epochs=2)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 2 * STEPS
    assert "checkpoint-6: resumed with num_train_epochs 1 -> 2" in caplog.text, caplog.text


def test_overwrite_output_dir_discards_an_earlier_run_before_the_first_step(finished_run, tmp_path, reliability):
    """The issue's case: a new run with --overwrite_output_dir, killed, then resumed, continued from the *old*
    run's newer checkpoint and exited 0 with the old model."""
    out = copy_run(finished_run, tmp_path)
    old_run = read_marker(str(out / "checkpoint-6"))["run"]["id"]

    class StopAfterStep3(transformers.TrainerCallback):  # stands for a kill after the save of step 2
        def on_step_begin(self, args, state, control, **kwargs):
            assert not (out / "checkpoint-6").exists(), "the earlier run's checkpoints are still there"
            if state.global_step == 3:
                control.should_training_stop = True

    new = trainer_for(out, overwrite_output_dir=True, learning_rate=5e-4)
    new.add_callback(StopAfterStep3())
    reliability.fault_injected()
    new.train()
    left = sorted(p.name for p in out.glob("checkpoint-*"))
    assert left == ["checkpoint-2"], left
    assert read_marker(str(out / "checkpoint-2"))["run"]["id"] not in (None, old_run)
    resumed = trainer_for(out, learning_rate=5e-4)
    resumed.train(resume_from_checkpoint=True)  # from this run's checkpoint-2, not the old run's checkpoint-6
    reference = trainer_for(tmp_path / "reference", learning_rate=5e-4)
    reference.train()
    for key, value in weights(reference).items():
        torch.testing.assert_close(weights(resumed)[key], value, atol=1e-6, rtol=0, msg=key)
    reliability.fault_survived()


def test_checkpoints_of_two_runs_in_one_folder_are_refused(finished_run, tmp_path, reliability):
    """Without --overwrite_output_dir (Python, where transformers 5 has no such flag), a new run beside an old
    one: which to continue is not guessed."""
    out = copy_run(finished_run, tmp_path)
    for name in ("checkpoint-2", "checkpoint-4"):
        shutil.rmtree(out / name)
    trainer_for(out, max_steps=2).train()  # a new run's checkpoint-2 beside the old run's checkpoint-6
    reliability.expect_clear_error(
        lambda: trainer_for(out).train(resume_from_checkpoint=True), ("more than one training run", "checkpoint-6")
    )


def test_a_folder_rewritten_in_place_loses_its_marker_first(finished_run, tmp_path, reliability):
    """A new run saving checkpoint-2 over an old run's marked checkpoint-2, killed in the middle of the save: the
    folder must not stay marked complete (it would be resumed from as the old run's)."""
    out = copy_run(finished_run, tmp_path)

    class DieInSave(transformers.TrainerCallback):  # given to the constructor: runs before the marker is written
        def on_save(self, args, state, control, **kwargs):
            raise KeyboardInterrupt("killed in the save")

    trainer = trainer_for(out, max_steps=2, callbacks=[DieInSave()])
    reliability.fault_injected()
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert (out / "checkpoint-2").is_dir() and not is_complete(str(out / "checkpoint-2"))
    assert checkpoint_problem(str(out / "checkpoint-2")) is not None
    reliability.fault_survived()


@pytest.mark.parametrize("value", ["True", "true"])
def test_resume_from_checkpoint_true_on_the_command_line_means_the_newest(finished_run, tmp_path, value, reliability):
    out = copy_run(finished_run, tmp_path)
    (args,) = transformers.HfArgumentParser(IPUTrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", str(out), "--do_train", "--resume_from_checkpoint", value]
    )
    assert args.resume_from_checkpoint is True
    assert args.checkpoint_in_output_dir() == str(out / "checkpoint-6")
    shutil.rmtree(out)
    os.makedirs(out)
    reliability.expect_clear_error(args.checkpoint_in_output_dir, ("--resume_from_checkpoint True", str(out)))


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--resume_from_checkpoint", "no/such/folder"], ("--resume_from_checkpoint", "no such folder")),
        (["--resume_from_checkpoint", "True", "--overwrite_output_dir"], ("--overwrite_output_dir",)),
    ],
)
def test_resume_arguments_checked_before_any_work(tmp_path, argv, names, reliability):
    def parse_and_check():
        (args,) = transformers.HfArgumentParser(IPUTrainingArguments).parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path / "out"), "--do_train", *argv]
        )
        return args.checkpoint_in_output_dir()

    reliability.expect_clear_error(parse_and_check, names)


def test_marker_lists_every_file_with_size_and_hash(finished_run, reliability):
    for checkpoint in sorted(finished_run[0].glob("checkpoint-*")):
        marker = read_marker(str(checkpoint))
        files = sorted(p.name for p in checkpoint.iterdir() if p.name != COMPLETE_MARKER)
        assert sorted(marker["files"]) == files and all(e["size"] > 0 for e in marker["files"].values())
        assert checkpoint_problem(str(checkpoint)) is None
        reliability.checkpoint_verified()
