"""IPUTrainingArguments: the reference command's flags, the removed transformers 4 arguments, the IPU config."""

from __future__ import annotations

import shlex

import pytest
from transformers import HfArgumentParser

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig, IPUTrainingArguments

from .conftest import REPO_ROOT

REFERENCE = (
    "--ipu_config_name=./ --do_train --do_eval --output_dir {out} --overwrite_output_dir "
    "--per_device_train_batch_size 2 --per_device_eval_batch_size 2 --learning_rate 6e-5 --num_train_epochs 3 "
    "--seed 1984 --lr_scheduler_type linear --loss_scaling 64 --weight_decay 0.01 --warmup_ratio 0.1"
)


def parse(argv: str) -> IPUTrainingArguments:
    (args,) = HfArgumentParser(IPUTrainingArguments).parse_args_into_dataclasses(shlex.split(argv))
    return args


def test_reference_command_flags_parse_with_their_meaning(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT / "examples" / "question-answering")
    args = parse(REFERENCE.format(out=tmp_path / "out"))
    assert args.overwrite_output_dir and args.loss_scaling == 64 and args.warmup_ratio == 0.1
    assert args.get_warmup_steps(1000) == 100  # 10% of the steps, as in transformers 4
    assert args.learning_rate == 6e-5 and args.seed == 1984 and args.per_device_train_batch_size == 2
    config = args.load_ipu_config()
    assert config == IPUConfig.from_pretrained(REPO_ROOT / "examples" / "question-answering", seed=1984)
    assert args.precision("cpu") == "fp32"


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_without_native_bf16_is_said_once(tmp_path, monkeypatch, caplog, native):
    monkeypatch.setattr("optimum_ipu.trainer.training_args.cpu_supports_bf16", lambda: native)
    args = IPUTrainingArguments(output_dir=str(tmp_path), bf16=True, use_cpu=True)
    with caplog.at_level("WARNING", logger="optimum_ipu.trainer.training_args"):
        assert args.precision("cpu") == "bf16"  # kept as asked: the numbers are a bf16 run's
    said = [r.getMessage() for r in caplog.records if "no native bf16" in r.getMessage()]
    assert len(said) == (0 if native else 1), said


def test_warmup_steps_win_over_ratio(tmp_path):
    args = IPUTrainingArguments(output_dir=str(tmp_path), warmup_ratio=0.5, warmup_steps=7)
    assert args.get_warmup_steps(100) == 7
    assert IPUTrainingArguments(output_dir=str(tmp_path), warmup_ratio=1.0).get_warmup_steps(100) == 100


def test_ipu_config_from_arguments(tmp_path):
    IPUConfig(layers_per_ipu=[0, -1], gradient_accumulation_steps=4).save_pretrained(tmp_path / "cfg")
    args = IPUTrainingArguments(
        output_dir=str(tmp_path / "out"),
        ipu_config_name=str(tmp_path / "cfg"),
        ipu_config_overrides="device_iterations=3",
        n_ipu=8,
        auto_loss_scaling=True,
        gradient_checkpointing=True,
        seed=5,
    )
    config = args.load_ipu_config()
    assert config.replication_factor == 4 and config.device_iterations == 3 and config.gradient_accumulation_steps == 4
    assert config.auto_loss_scaling and config.recompute_checkpoint_every_layer and config.seed == 5
    args.n_ipu = 3
    with pytest.raises(IncompatibleIPUConfigError, match="--n_ipu 3 is not a multiple of `ipus_per_replica` 2"):
        args.load_ipu_config()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"warmup_ratio": 1.5}, r"--warmup_ratio: got 1.5"),
        ({"dataloader_mode": "fast"}, r"--dataloader_mode: got 'fast'; expected one of sync, async"),
        ({"loss_scaling": -1.0}, r"--loss_scaling: got -1.0"),
        ({"n_ipu": 0}, r"--n_ipu: got 0"),
        ({"fp32": True, "bf16": True}, r"--fp32 cannot be combined"),
    ],
)
def test_bad_arguments_name_the_flag(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        IPUTrainingArguments(output_dir=str(tmp_path), **kwargs)


def test_output_dir_guard(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text("{}")
    assert not IPUTrainingArguments(output_dir=str(tmp_path / "out")).output_dir_is_reusable()
    assert IPUTrainingArguments(output_dir=str(tmp_path / "out"), overwrite_output_dir=True).output_dir_is_reusable()
    assert IPUTrainingArguments(output_dir=str(tmp_path / "new")).output_dir_is_reusable()
