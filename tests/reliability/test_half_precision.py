"""Faults of half precision through `IPUTrainer`: an fp16 overflow skips its step (dynamic scale: lowered; static:
reported) and training goes on; a NaN loss stops with a message naming the step unless asked to train on, and the
logs never hide it by default. (The engine-level cases are in tests/test_engine.py.)"""

from __future__ import annotations

import logging

import datasets
import pytest
import torch
import transformers
from transformers import HfArgumentParser

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments

from ..tiny_models import tiny_inputs, tiny_model

CLASS = "BertForSequenceClassification"
STEPS = 4  # 16 rows, micro-batches of 2, 2 per step


def dataset() -> datasets.Dataset:
    data = tiny_inputs(CLASS, batch=2 * 2 * STEPS, seed=0)
    return datasets.Dataset.from_dict({k: v.tolist() for k, v in data.items()})


def trainer_for(out, model, config: IPUConfig, **kwargs) -> IPUTrainer:
    args = IPUTrainingArguments(
        output_dir=str(out), per_device_train_batch_size=2, num_train_epochs=1, learning_rate=1e-3, logging_steps=1,
        report_to=[], seed=7, save_strategy="no", disable_tqdm=True, **kwargs,
    )  # fmt: skip
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


def overflow_at(trainer: IPUTrainer, step: int) -> None:
    """Make every gradient of the classifier infinite during optimizer step `step` (1-based): an fp16 overflow."""
    weight = trainer.model.classifier.weight
    weight.register_hook(lambda grad: grad * float("inf") if trainer.state.global_step + 1 == step else grad)


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
    trainer = trainer_for(tmp_path, model, IPUConfig(gradient_accumulation_steps=2, auto_loss_scaling=dynamic),
                          fp16=True, loss_scaling=1024.0)  # fmt: skip
    overflow_at(trainer, step=2)
    around = WeightsAroundStep(model, step=2)
    trainer.add_callback(around)
    reliability.fault_injected()
    with caplog.at_level(logging.INFO, logger="optimum_ipu"):
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
    trainer = trainer_for(tmp_path, tiny_model(CLASS), IPUConfig(gradient_accumulation_steps=2), fp16=True,
                          loss_scaling=64.0)  # fmt: skip
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
    trainer = trainer_for(tmp_path, model, IPUConfig(gradient_accumulation_steps=2, auto_loss_scaling=True),
                          fp16=True, loss_scaling=1024.0, stop_on_nan=False)  # fmt: skip
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
