"""The single-process engine through the step protocol: accumulation, half precision, overflow skips, compile."""

from __future__ import annotations

import copy

import pytest
import torch

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.runtime.engine import Engine
from optimum_ipu.runtime.step import run_steps

from .tiny_models import tiny_inputs, tiny_model

CLASS = "BertForSequenceClassification"


class Trained:
    """An engine and its SGD optimizer, stepped by the step protocol's loop (`optimum_ipu.runtime.step.run_steps`)."""

    def __init__(self, config: IPUConfig, seed: int = 0, lr: float = 0.1, **kwargs) -> None:
        pipelined = to_pipelined(tiny_model(CLASS, seed=seed), config, parallelize=True)
        self.engine = Engine(pipelined, config, **kwargs)
        self.model, self.optimizer = self.engine.model, torch.optim.SGD(pipelined.parameters(), lr=lr)

    def train_step(self, batch: dict, steps: int = 1, lr_scheduler=None) -> torch.Tensor:
        """`steps` optimizer steps over `batch`; the last one's loss."""
        micro = self.engine.ipu_config.gradient_accumulation_steps
        return run_steps(self.engine, self.optimizer, batch, micro, steps, lr_scheduler)[-1]


def make_engine(config: IPUConfig, seed: int = 0, lr: float = 0.1, **kwargs) -> Trained:
    return Trained(config, seed, lr, **kwargs)


def weights(engine: Trained) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.model.state_dict().items()}


def assert_same_weights(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=0, msg=key)


def test_accumulation_equals_one_big_micro_batch():
    accumulated = make_engine(IPUConfig(gradient_accumulation_steps=4))
    big = make_engine(IPUConfig(gradient_accumulation_steps=1))
    initial = weights(big)
    for step in range(3):
        batch = tiny_inputs(CLASS, batch=8, seed=step)
        loss_a = accumulated.train_step(batch)
        loss_b = big.train_step(batch)
        torch.testing.assert_close(loss_a, loss_b, atol=1e-5, rtol=0)
    assert_same_weights(weights(accumulated), weights(big))
    assert any(not torch.equal(initial[k], v) for k, v in weights(big).items()), "training changed nothing"


def test_recompute_changes_no_numbers():
    plain = make_engine(IPUConfig(layers_per_ipu=[0, -1], gradient_accumulation_steps=2))
    recomputed = make_engine(
        IPUConfig(layers_per_ipu=[0, -1], gradient_accumulation_steps=2, recompute_checkpoint_every_layer=True)
    )
    for step in range(2):
        batch = tiny_inputs(CLASS, batch=4, seed=step)
        torch.testing.assert_close(plain.train_step(batch), recomputed.train_step(batch), atol=1e-6, rtol=0)
    assert_same_weights(weights(plain), weights(recomputed), atol=1e-6)


def test_eval_step_uses_inference_iterations_and_keeps_all_rows():
    engine = make_engine(IPUConfig(inference_device_iterations=3))
    batch = tiny_inputs(CLASS, batch=6, seed=5)
    out = engine.engine.eval_step(batch)
    reference = copy.deepcopy(engine.model.model).eval()(**batch)
    assert out["logits"].shape == (6, 3)
    torch.testing.assert_close(out["logits"], reference.logits, atol=1e-5, rtol=0)
    assert engine.engine.ipu_config.mode == "training"  # the model's eval() picks its layout; the config stays
    with pytest.raises(ValueError, match="cannot be split into 3 equal parts"):
        engine.engine.eval_step(tiny_inputs(CLASS, batch=4))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_trains_to_lower_loss(precision):
    engine = make_engine(IPUConfig(auto_loss_scaling=True), lr=0.05, precision=precision, loss_scaling=64.0)
    batch = tiny_inputs(CLASS, batch=8, seed=11)
    first = float(engine.train_step(batch))
    for _ in range(15):
        last = float(engine.train_step(batch))
    assert last < first * 0.8, (first, last)


def test_overflow_skips_step_and_lowers_dynamic_scale():
    engine = make_engine(IPUConfig(auto_loss_scaling=True), precision="fp16", loss_scaling=1024.0)
    param = next(engine.model.parameters())
    before = weights(engine)
    handle = param.register_hook(lambda grad: grad * float("inf"))  # an injected overflow
    engine.train_step(tiny_inputs(CLASS, batch=2))
    handle.remove()
    scaler = engine.engine.loss_scaler
    assert engine.engine.last_step_skipped and scaler.scale == 512.0 and scaler.overflows == 1
    assert_same_weights(weights(engine), before, atol=0)
    engine.train_step(tiny_inputs(CLASS, batch=2))
    assert not engine.engine.last_step_skipped and scaler.scale == 512.0


def test_static_scale_reports_overflow_and_keeps_scale(caplog):
    engine = make_engine(IPUConfig(), precision="fp16", loss_scaling=64.0)
    handle = next(engine.model.parameters()).register_hook(lambda grad: grad * float("nan"))
    engine.train_step(tiny_inputs(CLASS, batch=2))
    handle.remove()
    assert engine.engine.last_step_skipped and engine.engine.loss_scaler.scale == 64.0
    assert "static loss scale 64" in caplog.text


def test_a_skipped_step_is_counted_and_not_scheduled():
    engine = make_engine(IPUConfig(auto_loss_scaling=True), precision="fp16", loss_scaling=1024.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(engine.optimizer, lambda step: 1.0 / (step + 1))
    engine.train_step(tiny_inputs(CLASS, batch=4), steps=2, lr_scheduler=scheduler)
    assert scheduler.last_epoch == 2 and engine.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 / 3)
    handle = next(engine.model.parameters()).register_hook(lambda grad: grad * float("inf"))
    engine.train_step(tiny_inputs(CLASS, batch=2), lr_scheduler=scheduler)
    handle.remove()
    assert scheduler.last_epoch == 2 and engine.engine.optimizer_steps == 3


@pytest.mark.slow
def test_compiled_path_gives_eager_numbers(tmp_path):
    torch.compiler.reset()  # compile afresh, so that the cache folder is filled by this test
    config = IPUConfig(gradient_accumulation_steps=2, executable_cache_dir=str(tmp_path / "cache"))
    eager, compiled = make_engine(IPUConfig(gradient_accumulation_steps=2)), make_engine(config, compile=True)
    for step in range(2):
        batch = tiny_inputs(CLASS, batch=4, seed=step)
        torch.testing.assert_close(compiled.train_step(batch), eager.train_step(batch), atol=1e-5, rtol=1e-5)
    assert_same_weights(weights(compiled), weights(eager), atol=1e-5)
    assert any((tmp_path / "cache").rglob("*")), "compiled graphs were not cached in executable_cache_dir"
