"""The single-process engine: accumulation, device iterations, output modes, half precision, compile."""

from __future__ import annotations

import copy

import pytest
import torch

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.runtime.engine import Engine, reduce_output, split_batch

from .tiny_models import tiny_inputs, tiny_model

CLASS = "BertForSequenceClassification"


def make_engine(config: IPUConfig, seed: int = 0, lr: float = 0.1, **kwargs) -> Engine:
    pipelined = to_pipelined(tiny_model(CLASS, seed=seed), config, parallelize=True)
    optimizer = torch.optim.SGD(pipelined.parameters(), lr=lr)
    return Engine(pipelined, config, optimizer, **kwargs)


def weights(engine: Engine) -> dict[str, torch.Tensor]:
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


def test_device_iterations_equal_separate_calls():
    config = IPUConfig(device_iterations=4, gradient_accumulation_steps=2, output_mode="all")
    looped = make_engine(config)
    single = make_engine(IPUConfig(gradient_accumulation_steps=2))
    host_batch = tiny_inputs(CLASS, batch=16, seed=3)  # 4 iterations x 2 micro-batches x 2 rows
    losses = looped.train_step(host_batch)
    assert losses.shape == (4,) and looped.optimizer_steps == 4
    separate = torch.stack([single.train_step(part) for part in split_batch(host_batch, 4)])
    torch.testing.assert_close(losses, separate, atol=1e-5, rtol=0)
    assert_same_weights(weights(looped), weights(single))


def test_output_modes():
    values = torch.tensor([1.0, 2.0, 3.0])
    assert reduce_output(values, "final", training=True) == 3.0
    assert reduce_output(values, "sum", training=True) == 6.0
    assert torch.equal(reduce_output(values, "all", training=True), values)
    assert reduce_output(values, "default", training=True) == 3.0
    assert torch.equal(reduce_output(values, "default", training=False), values)


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
    out = engine.eval_step(batch)
    reference = copy.deepcopy(engine.model.model).eval()(**batch)
    assert out["logits"].shape == (6, 3)
    torch.testing.assert_close(out["logits"], reference.logits, atol=1e-5, rtol=0)
    assert engine.ipu_config.mode == "training"  # the model's eval() selects its layout; the config is left as is
    with pytest.raises(ValueError, match="cannot be split into 3 equal parts"):
        engine.eval_step(tiny_inputs(CLASS, batch=4))


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
    assert engine.last_step_skipped and engine.loss_scaler.scale == 512.0 and engine.loss_scaler.overflows == 1
    assert_same_weights(weights(engine), before, atol=0)
    engine.train_step(tiny_inputs(CLASS, batch=2))
    assert not engine.last_step_skipped and engine.loss_scaler.scale == 512.0


def test_static_scale_reports_overflow_and_keeps_scale(caplog):
    engine = make_engine(IPUConfig(), precision="fp16", loss_scaling=64.0)
    handle = next(engine.model.parameters()).register_hook(lambda grad: grad * float("nan"))
    engine.train_step(tiny_inputs(CLASS, batch=2))
    handle.remove()
    assert engine.last_step_skipped and engine.loss_scaler.scale == 64.0
    assert "static loss scale 64" in caplog.text


def test_seed_and_lr_scheduler_step_per_optimizer_step():
    config = IPUConfig(device_iterations=2)
    engine = make_engine(config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(engine.optimizer, lambda step: 1.0 / (step + 1))
    engine.lr_scheduler = scheduler
    engine.train_step(tiny_inputs(CLASS, batch=4))
    assert scheduler.last_epoch == 2 and engine.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 / 3)


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
