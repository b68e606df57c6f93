"""Multi-label sequence classification with packing (problem_type="multi_label_classification"), as Optimum
Graphcore's packed-BERT notebook: per-sequence logits and BCE loss equal those of each feature run alone, and one
IPUTrainer step on packed rows equals one on the same features unpacked."""

from __future__ import annotations

import datasets
import pytest
import torch
import transformers

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.models.plans import position_offset
from optimum_ipu.packing import (
    PackedDataCollator,
    PackedSequenceClassificationLoss,
    pack_features,
    prepare_packed_training,
    sequence_classification_logits,
)

from .helpers import LENGTHS, MAX_LEN, assert_same_grads, feature_alone, packed_rows, packing_features, take_grads
from .tiny_models import tiny_config

CLASSES = 4
FAMILIES = {"Bert": "bert", "Roberta": "roberta", "DistilBert": "distilbert"}


def multi_label_model(family: str, seed: int = 0) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    config = tiny_config(FAMILIES[family])
    config.num_labels, config.problem_type = CLASSES, "multi_label_classification"
    return getattr(transformers, f"{family}ForSequenceClassification")(config)


def multi_label_features(seed: int = 3) -> dict[str, list]:
    """The packing test features, each with a multi-hot vector of CLASSES labels (some with none, some with
    several)."""
    features = {k: v for k, v in packing_features(seed).items() if k in ("input_ids", "token_type_ids")}
    g = torch.Generator().manual_seed(seed)
    features["labels"] = torch.randint(0, 2, (len(LENGTHS), CLASSES), generator=g).float().tolist()
    return features


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_multi_label_logits_loss_and_grads_equal_each_feature_alone(family):
    features = multi_label_features()
    packed = pack_features(features, MAX_LEN, max_sequences_per_row=3)
    model = multi_label_model(family).train()  # dropout is off in the tiny configs
    batch = PackedDataCollator(MAX_LEN, 3, position_offset=position_offset(model.config))(packed_rows(packed))
    labels = batch.pop("labels")
    assert labels.shape == (len(packed["input_ids"]), 3, 2 + CLASSES) and labels.dtype == torch.float
    out = model(**batch, output_hidden_states=True)
    logits = sequence_classification_logits(model, out.hidden_states[-1], labels)
    order = [i for row in packed["feature_index"] for i in row]  # labelled slots, row-major
    packed_loss = PackedSequenceClassificationLoss(model)(out, labels)
    (packed_loss * len(LENGTHS)).backward()
    packed_grads = take_grads(model)

    total = 0.0
    for k, i in enumerate(order):
        alone = model(**feature_alone(features, i), labels=torch.tensor([features["labels"][i]]))
        torch.testing.assert_close(logits[k], alone.logits[0], atol=1e-5, rtol=0)
        total = total + alone.loss  # transformers' BCEWithLogitsLoss: the mean over the feature's classes
    torch.testing.assert_close(packed_loss, total / len(LENGTHS), atol=1e-6, rtol=1e-5)
    total.backward()
    assert_same_grads(packed_grads, take_grads(model))


def test_bad_multi_label_slots_are_refused():
    features = multi_label_features()
    rows = packed_rows(pack_features(features, MAX_LEN))
    rows[0]["labels"] = [*rows[0]["labels"][:-1], 1]  # one scalar among vectors
    with pytest.raises(ValueError, match="multi-label rows need one vector"):
        PackedDataCollator(MAX_LEN, 8)(rows)
    model = multi_label_model("Bert")
    short = {**features, "labels": [v[:-1] for v in features["labels"]]}  # CLASSES - 1 values a feature
    batch = PackedDataCollator(MAX_LEN, 8)(packed_rows(pack_features(short, MAX_LEN)))
    labels = batch.pop("labels")
    with pytest.raises(ValueError, match="num_labels=4"):
        PackedSequenceClassificationLoss(model)(model(**batch, output_hidden_states=True), labels)


def _padded(features: dict[str, list]) -> datasets.Dataset:
    """The features unpacked, padded to MAX_LEN with their attention masks."""
    rows = {"input_ids": [], "token_type_ids": [], "attention_mask": [], "labels": features["labels"]}
    for ids, types in zip(features["input_ids"], features["token_type_ids"], strict=True):
        pad = MAX_LEN - len(ids)
        rows["input_ids"].append(ids + [0] * pad)
        rows["token_type_ids"].append(types + [0] * pad)
        rows["attention_mask"].append([1] * len(ids) + [0] * pad)
    return datasets.Dataset.from_dict(rows)


def _one_step(tmp_path, name: str, batch_size: int, **trainer_kwargs) -> tuple[IPUTrainer, float]:
    args = IPUTrainingArguments(
        output_dir=str(tmp_path / name),
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=3,
        max_steps=1,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **({"label_names": ["labels"]} if "compute_loss_func" in trainer_kwargs else {}),
    )
    trainer = IPUTrainer(model=trainer_kwargs.pop("model"), ipu_config=IPUConfig(), args=args, **trainer_kwargs)
    return trainer, trainer.train().training_loss


def test_one_ipu_trainer_step_packed_equals_unpacked(tmp_path):
    """The trainer path a script takes (`prepare_packed_training`, `compute_loss_func`, `label_names`): one SGD step
    over every feature, packed into 4 rows or padded into 9, gives the same loss and the same weights; evaluation
    batches (unpacked) get the model's own BCE loss."""
    features = multi_label_features()
    unpacked_model = multi_label_model("Bert", seed=5)
    unpacked, unpacked_loss = _one_step(
        tmp_path, "unpacked", len(LENGTHS), model=unpacked_model, train_dataset=_padded(features)
    )
    packed_model = multi_label_model("Bert", seed=5)
    train = datasets.Dataset.from_dict(features)
    packing = prepare_packed_training(
        packed_model,
        train,
        MAX_LEN,
        0,
        transformers.default_data_collator,
        PackedSequenceClassificationLoss(packed_model),
        output_hidden_states=True,
    )
    rows = len(packing.train_dataset)
    assert rows < len(LENGTHS) and packing.features == len(LENGTHS)
    packed, packed_loss = _one_step(
        tmp_path,
        "packed",
        rows,
        model=packed_model,
        train_dataset=packing.train_dataset,
        data_collator=packing.data_collator,
        compute_loss_func=packing.compute_loss_func,
    )
    assert abs(packed_loss - unpacked_loss) < 1e-5 and 0.3 < packed_loss < 1.5
    for (name, after), before in zip(
        packed.model.state_dict().items(), unpacked.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-4, msg=name)
    initial = multi_label_model("Bert", seed=5).classifier.weight
    assert (packed.model.classifier.weight - initial).abs().max() > 1e-3  # the step changed the weights
    evaluation = _padded(features)
    assert abs(packed.evaluate(evaluation)["eval_loss"] - unpacked.evaluate(evaluation)["eval_loss"]) < 1e-5
