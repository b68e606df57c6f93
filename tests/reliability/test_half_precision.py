"""Faults of half precision through `IPUTrainer`: an fp16 overflow skips its step (dynamic scale: lowered; static:
reported) and training goes on; a NaN loss stops with a message naming the step unless asked to train on, and the
logs never hide it by default. (The engine-level cases are in tests/test_engine.py.)"""

from __future__ import annotations

import json
import logging
import math

import datasets
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import HfArgumentParser

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.errors import SkippedStepsError
from optimum_ipu.runtime.precision import LossScaler
from optimum_ipu.trainer.checkpoints import write_marker

from ..tiny_models import tiny_inputs, tiny_model

CLASS = "BertForSequenceClassification"
STEPS = 4  # 16 rows, micro-batches of 2, 2 per step


def dataset() -> datasets.Dataset:
    data = tiny_inputs(CLASS, batch=2 * 2 * STEPS, seed=0)
    return datasets.Dataset.from_dict({k: v.tolist() for k, v in data.items()})


def trainer_for(out, model, config: IPUConfig, **kwargs) -> IPUTrainer:
    kwargs = {"save_strategy": "no", **kwargs}
    args = IPUTrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=2,
        num_train_epochs=1,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        seed=7,
        disable_tqdm=True,
        **kwargs,
    )
    return IPUTrainer(model, config, args, train_dataset=dataset())


class WeightsAroundStep(transformers.TrainerCallback):
    """The weights before and after one optimizer step (1-based, as `Trainer` counts them in its logs)."""

    def __init__(self, model: torch.nn.Module, step: int) -> None:
        self.model, self.step, self.before, self.after = model, step, None, None

    def _copy(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            self.before = self._copy()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.after = self._copy()


def overflow_at(trainer: IPUTrainer, step: int, every_step_from: bool = False) -> None:
    """Make every gradient of the classifier infinite during optimizer step `step` (1-based), or during every step
    from it on: an fp16 overflow."""
    weight = trainer.model.classifier.weight

    def hook(grad):
        now = trainer.state.global_step + 1
        return grad * float("inf") if now == step or (every_step_from and now >= step) else grad

    weight.register_hook(hook)


def nan_loss_at(model: torch.nn.Module, micro_batch: int) -> None:
    """Turn the activations of one micro-batch (1-based, counted over the run) to NaN: its loss is NaN."""
    calls = {"n": 0}

    def poison(module, args, output):
        calls["n"] += 1
        return output * float("nan") if calls["n"] == micro_batch else output

    model.bert.encoder.layer[0].register_forward_hook(poison)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread for these tiny models: on a small shared machine more threads only contend (10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def losses(trainer: IPUTrainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic-scale", "static-scale"])
def test_fp16_overflow_skips_the_step_and_training_goes_on(tmp_path, reliability, caplog, dynamic):
    model = tiny_model(CLASS)
    trainer = trainer_for(
        tmp_path,
        model,
        IPUConfig(gradient_accumulation_steps=2, auto_loss_scaling=dynamic),
        fp16=True,
        loss_scaling=1024.0,
    )
    overflow_at(trainer, step=2)
    around = WeightsAroundStep(model, step=2)
    trainer.add_callback(around)
    reliability.fault_injected()
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):  # skipped steps are WARNINGs: the scripts show them
        trainer.train()  # stop_on_nan is on: an overflow in the gradients is not a NaN loss
    scaler = trainer.engine.loss_scaler
    assert trainer.state.global_step == STEPS and scaler.overflows == 1
    assert scaler.scale == (512.0 if dynamic else 1024.0)
    assert all(torch.equal(around.before[k], around.after[k]) for k in around.before), (
        "the overflowed step changed weights"
    )
    assert trainer.lr_scheduler.scheduler.last_epoch == STEPS - 1  # the schedule does not advance on a skipped step
    if dynamic:
        assert "fp16 overflow at step" in caplog.text and "loss scale lowered to 512" in caplog.text
    else:
        assert "with static loss scale 1024: step skipped" in caplog.text
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())
    reliability.fault_survived()


def test_fp16_overflow_report_names_the_step_as_the_logs_do(tmp_path, reliability, caplog):
    trainer = trainer_for(
        tmp_path, tiny_model(CLASS), IPUConfig(gradient_accumulation_steps=2), fp16=True, loss_scaling=64.0
    )
    overflow_at(trainer, step=2)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        trainer.train()
    assert reliability.fault("fp16 overflow at step 2 " in caplog.text), caplog.text


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_nan_loss_stops_naming_the_step_unless_asked_to_train_on(tmp_path, reliability, precision):
    half = {"fp16": True, "loss_scaling": 1024.0} if precision == "fp16" else {}
    config = IPUConfig(gradient_accumulation_steps=2, auto_loss_scaling=precision == "fp16")
    model = tiny_model(CLASS)
    nan_loss_at(model, micro_batch=5)  # the first micro-batch of step 3
    trainer = trainer_for(tmp_path / "stop", model, config, **half)
    reliability.fault_injected()
    with pytest.raises(FloatingPointError, match="NaN or infinite at step 3 .*--stop_on_nan false"):
        trainer.train()
    assert trainer.state.global_step == 2
    reliability.fault_survived()

    # Asked to train on: it does, and the NaN is in the logs (logging_nan_inf_filter is off by default).
    model = tiny_model(CLASS)
    nan_loss_at(model, micro_batch=5)
    trainer = trainer_for(tmp_path / "on", model, config, stop_on_nan=False, **half)
    reliability.fault_injected()
    trainer.train()
    logged = losses(trainer)
    assert trainer.state.global_step == STEPS and len(logged) == STEPS
    assert logged[2] != logged[2] and all(x == x for x in logged[:2]), logged
    if precision == "fp16":  # loss scaling drops the non-finite gradients: the NaN step changes no weight
        assert all(torch.isfinite(v).all() for v in model.state_dict().values())
    reliability.fault_survived()


def test_one_nan_loss_leaves_later_logged_losses_finite(tmp_path, reliability):
    """transformers resets its running loss with `tr_loss -= tr_loss`: a NaN stayed NaN in every later log."""
    model = tiny_model(CLASS)
    nan_loss_at(model, micro_batch=5)
    trainer = trainer_for(
        tmp_path,
        model,
        IPUConfig(gradient_accumulation_steps=2, auto_loss_scaling=True),
        fp16=True,
        loss_scaling=1024.0,
        stop_on_nan=False,
    )
    trainer.train()
    logged = losses(trainer)
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())  # the step was skipped: no damage
    assert reliability.fault(logged[3] == logged[3]), f"step 4 had a finite loss but the log says {logged}"


def test_nan_filter_is_off_unless_asked(tmp_path):
    (args,) = HfArgumentParser(IPUTrainingArguments).parse_args_into_dataclasses(["--output_dir", str(tmp_path)])
    assert args.logging_nan_inf_filter is False and args.stop_on_nan is True
    (args,) = HfArgumentParser(IPUTrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--logging_nan_inf_filter", "true"]
    )
    assert args.logging_nan_inf_filter is True  # hiding NaN is possible, only when asked for


# Loss scales that train nothing in fp16: not finite, <= 0, so small that gradients underflow, so large that every
# step overflows. Generated beyond the instances (nan, inf, 1e-30, an auto scale starting at 1e30).
ABSURD_SCALES = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e-30, 0.5, 2.0**25, 1e30]) | st.floats(
    allow_nan=True, allow_infinity=True
).filter(lambda x: not 1.0 <= x <= 2.0**24)


@settings(max_examples=40, deadline=None)
@given(scale=ABSURD_SCALES, auto=st.booleans(), route=st.sampled_from(["python", "command line", "engine"]))
def test_absurd_loss_scales_are_refused_at_start(scale, auto, route, reliability):
    if route == "python":
        call = lambda: IPUTrainingArguments(output_dir="o", fp16=True, loss_scaling=scale, auto_loss_scaling=auto)  # noqa: E731
        names = ("--loss_scaling",)
    elif route == "command line":
        # --flag=value: a value such as -inf would otherwise read as a flag
        argv = ["--output_dir", "o", "--fp16", f"--loss_scaling={scale!r}", *(["--auto_loss_scaling"] * auto)]
        call = lambda: HfArgumentParser(IPUTrainingArguments).parse_args_into_dataclasses(argv)  # noqa: E731
        names = ("--loss_scaling",)
    else:  # the engine's own scaler, as Engine(precision="fp16", loss_scaling=...) builds it
        call = lambda: LossScaler(scale, dynamic=auto)  # noqa: E731
        names = ("loss scale",)
    reliability.expect_clear_error(call, names)


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic-scale", "static-scale"])
def test_a_run_of_skipped_steps_stops_naming_the_scale(tmp_path, reliability, dynamic):
    model = tiny_model(CLASS)
    config = IPUConfig(gradient_accumulation_steps=2, auto_loss_scaling=dynamic)
    trainer = trainer_for(tmp_path, model, config, fp16=True, loss_scaling=1024.0, max_consecutive_skipped_steps=3)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    overflow_at(trainer, step=1, every_step_from=True)
    reliability.fault_injected()
    last_scale = "256" if dynamic else "1024"  # dynamic: 1024, 512, 256 for steps 1-3
    with pytest.raises(
        SkippedStepsError,
        match=f"3 optimizer steps in a row .*loss scale {last_scale}.*--max_consecutive_skipped_steps 3",
    ):
        trainer.train()
    assert trainer.state.global_step == 2 and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    reliability.fault_survived()


def test_a_run_that_skipped_every_step_does_not_end_normally(tmp_path, reliability):
    """Below the bound (4 steps, bound 50), every step skipped: the run ends in an error, not with unchanged
    weights and exit 0."""
    trainer = trainer_for(
        tmp_path,
        tiny_model(CLASS),
        IPUConfig(gradient_accumulation_steps=2, auto_loss_scaling=True),
        fp16=True,
        loss_scaling=1024.0,
    )
    overflow_at(trainer, step=1, every_step_from=True)
    reliability.fault_injected()
    with pytest.raises(SkippedStepsError, match=f"every optimizer step of this run \\({STEPS}\\)"):
        trainer.train()
    reliability.fault_survived()


@pytest.fixture(scope="module")
def fp16_checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp16-run")
    trainer = trainer_for(
        out,
        tiny_model(CLASS),
        IPUConfig(gradient_accumulation_steps=2, auto_loss_scaling=True),
        fp16=True,
        loss_scaling=1024.0,
        save_strategy="steps",
        save_steps=2,
    )
    trainer.train()
    return out / "checkpoint-2"


@pytest.mark.parametrize(
    "saved",
    [
        {"scale": math.nan},
        {"scale": math.inf},
        {"scale": 0.0},
        {"scale": -4.0},
        {"scale": 1e30},
        {"scale": "64"},
        {"scale": 1024.0, "overflows": -1},
        {"scale": 1024.0, "good_steps": 0.5},
        {},
    ],
    ids=["nan", "inf", "zero", "negative", "huge", "string", "negative-count", "float-count", "no-scale"],
)
def test_a_checkpoint_with_an_unusable_saved_scale_is_refused_on_resume(fp16_checkpoint, tmp_path, saved, reliability):
    """The scale was already bad when saved (the marker's hashes match it): the resume refuses, naming the file."""
    import shutil

    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(fp16_checkpoint, checkpoint)
    state = {**json.loads((checkpoint / "loss_scaler.json").read_text()), **saved}
    if not saved:
        del state["scale"]
    (checkpoint / "loss_scaler.json").write_text(json.dumps(state))
    write_marker(str(checkpoint), 2, json.loads((checkpoint / "checkpoint_complete.json").read_text())["run"])
    trainer = trainer_for(
        tmp_path / "out",
        tiny_model(CLASS),
        IPUConfig(gradient_accumulation_steps=2, auto_loss_scaling=True),
        fp16=True,
        loss_scaling=1024.0,
        save_strategy="steps",
        save_steps=2,
    )
    reliability.expect_clear_error(lambda: trainer.train(resume_from_checkpoint=str(checkpoint)), "loss_scaler.json")
    assert trainer.state.global_step == 0
