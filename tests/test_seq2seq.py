"""IPUSeq2SeqTrainer: evaluate / predict with generation at static shapes give stock `generate()`'s tokens."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
import transformers

from optimum_ipu import IPUConfig, IPUSeq2SeqTrainer, IPUSeq2SeqTrainingArguments, IPUTrainingArguments

from .helpers import PAD, generating_model

PROMPT_LENGTHS = [6, 3, 8, 5, 4]  # five examples: with 2 per batch, the last batch has one row
STATIC_PROMPT = 10


def examples() -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(5)
    rows = []
    for n in PROMPT_LENGTHS:
        rows.append(
            {
                "input_ids": torch.randint(2, 90, (n,), generator=g).tolist(),
                "labels": torch.randint(2, 90, (4,), generator=g).tolist(),
            }
        )
    return rows


def collate(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Right-pads prompts to the longest of the batch (dynamic shapes: the trainer makes them static)."""
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.tensor([f["input_ids"] + [PAD] * (width - len(f["input_ids"])) for f in features])
    return {
        "input_ids": ids,
        "attention_mask": (ids != PAD).long(),
        "labels": torch.tensor([f["labels"] for f in features]),
    }


def arguments(out, **kwargs) -> IPUSeq2SeqTrainingArguments:
    defaults = {
        "per_device_eval_batch_size": 2,
        "report_to": [],
        "disable_tqdm": True,
        "predict_with_generate": True,
        "generation_prompt_length": STATIC_PROMPT,
    }
    return IPUSeq2SeqTrainingArguments(output_dir=str(out), **{**defaults, **kwargs})


@pytest.mark.parametrize("pad_on_batch_axis", [False, True], ids=["short-last-batch", "pad_on_batch_axis"])
def test_predict_generates_stock_tokens_at_static_shapes(tmp_path, pad_on_batch_axis):
    model = generating_model("T5ForConditionalGeneration")
    seen = {}

    def metrics(prediction: transformers.EvalPrediction) -> dict[str, float]:
        seen["predictions"] = prediction.predictions
        return {"exact": float((prediction.predictions == prediction.label_ids).all(-1).mean())}

    config = IPUConfig(layers_per_ipu=[-1, -1], ipus_per_replica=2)
    args = arguments(tmp_path, pad_on_batch_axis=pad_on_batch_axis)
    trainer = IPUSeq2SeqTrainer(model, config, args, data_collator=collate, compute_metrics=metrics)
    with mock.patch.object(model, "generate", wraps=model.generate) as spy:
        output = trainer.predict(examples(), max_length=9, num_beams=3)
    # every batch was generated at one shape: the padded batch of 2, the padded prompt, the static KV cache
    assert spy.call_count == 3
    assert {tuple(call.kwargs["input_ids"].shape) for call in spy.call_args_list} == {(2, STATIC_PROMPT)}
    assert {call.kwargs["cache_implementation"] for call in spy.call_args_list} == {"static"}
    assert output.predictions.shape == (len(PROMPT_LENGTHS), 9)
    assert {"test_loss", "test_exact"} <= set(output.metrics)
    assert np.array_equal(seen["predictions"], output.predictions)  # compute_metrics scored the generated tokens
    for row, example in zip(output.predictions, examples(), strict=True):
        with torch.no_grad():
            reference = model.generate(input_ids=torch.tensor([example["input_ids"]]), max_length=9, num_beams=3)[0]
        expected = reference.tolist() + [PAD] * (9 - len(reference))
        assert row.tolist() == expected


def test_evaluate_takes_generation_settings_from_the_arguments(tmp_path):
    model = generating_model("T5ForConditionalGeneration")
    trainer = IPUSeq2SeqTrainer(
        model,
        args=arguments(tmp_path, generation_max_length=7, generation_num_beams=2),
        data_collator=collate,
        eval_dataset=examples(),
        compute_metrics=lambda p: {"gen_len": float(p.predictions.shape[1])},
    )
    metrics = trainer.evaluate()
    assert metrics["eval_gen_len"] == 7 and np.isfinite(metrics["eval_loss"])
    assert trainer.evaluate(max_length=5)["eval_gen_len"] == 5  # an argument of evaluate() wins, as in HF


def test_without_generation_evaluate_is_the_teacher_forced_loss(tmp_path):
    model = generating_model("T5ForConditionalGeneration")
    trainer = IPUSeq2SeqTrainer(model, args=arguments(tmp_path, predict_with_generate=False), data_collator=collate)
    output = trainer.predict(examples())
    batch = collate(examples()[:2])
    with torch.no_grad():
        logits = model(**batch).logits
    np.testing.assert_allclose(output.predictions[0][:2], logits.numpy(), atol=1e-5)


def test_arguments_parse_like_hf_seq2seq_arguments(tmp_path):
    parser = transformers.HfArgumentParser(IPUSeq2SeqTrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(
        [
            "--output_dir",
            str(tmp_path),
            "--predict_with_generate",
            "--generation_max_length",
            "64",
            "--generation_num_beams",
            "4",
            "--generation_prompt_length",
            "128",
            "--ipu_config_name",
            "Graphcore/t5-small-ipu",
            "--warmup_ratio",
            "0.1",
        ]
    )
    assert isinstance(args, transformers.Seq2SeqTrainingArguments) and isinstance(args, IPUTrainingArguments)
    assert (args.predict_with_generate, args.generation_max_length, args.generation_num_beams) == (True, 64, 4)
    assert args.generation_prompt_length == 128 and args.ipu_config_name == "Graphcore/t5-small-ipu"
    assert args.sortish_sampler is False and args.generation_config is None
    assert args.to_dict()["generation_num_beams"] == 4
    with pytest.raises(ValueError, match="--generation_num_beams: got 0; expected a positive number"):
        IPUSeq2SeqTrainingArguments(output_dir=str(tmp_path), generation_num_beams=0)


def test_plain_ipu_arguments_are_a_clear_error(tmp_path):
    with pytest.raises(
        TypeError, match="IPUSeq2SeqTrainer needs IPUSeq2SeqTrainingArguments, got IPUTrainingArguments"
    ):
        IPUSeq2SeqTrainer(generating_model("T5ForConditionalGeneration"), args=IPUTrainingArguments(str(tmp_path)))
