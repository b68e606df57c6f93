"""Sequence packing: packed rows give each feature the numbers of running it alone; real SQuAD features pack."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from optimum_ipu.models.plans import position_offset
from optimum_ipu.packing import (
    PackedDataCollator,
    PackedSequenceClassificationLoss,
    check_packing_support,
    pack_features,
    pack_sequences,
    packed_question_answering_loss,
    sequence_classification_logits,
    unpack_logits,
)

from .conftest import REPO_ROOT
from .helpers import LENGTHS, MAX_LEN, assert_same_grads, feature_alone, packed_rows, packing_features, take_grads
from .tiny_models import tiny_model


@pytest.mark.parametrize(
    ("family", "attn"), [("Bert", "eager"), ("Bert", "sdpa"), ("Roberta", "sdpa"), ("DistilBert", "sdpa")]
)
def test_packed_qa_equals_each_feature_alone(family, attn):
    features = packing_features()
    qa = {k: v for k, v in features.items() if k != "labels"}
    packed = pack_features(qa, MAX_LEN)
    assert len(packed["input_ids"]) == math.ceil(sum(LENGTHS) / MAX_LEN)  # best fit reaches the bound here
    slots = max(map(len, packed["feature_index"]))
    model = tiny_model(f"{family}ForQuestionAnswering")
    model.set_attn_implementation(attn)
    check_packing_support(model)
    batch = PackedDataCollator(MAX_LEN, slots, position_offset=position_offset(model.config))(packed_rows(packed))
    assert batch["attention_mask"].shape == (len(packed["input_ids"]), 1, MAX_LEN, MAX_LEN)
    assert batch["labels"].shape == (len(packed["input_ids"]), slots, 4)
    model.train()  # dropout is off in the tiny config: train mode changes nothing but is what packing is for

    labels = batch.pop("labels")
    out = model(**batch)
    start, end = unpack_logits(out.start_logits, packed), unpack_logits(out.end_logits, packed)
    # the summed per-sequence loss: the mean over the batch's sequences times their number
    (packed_question_answering_loss(out, labels) * len(LENGTHS)).backward()
    packed_grads = take_grads(model)

    total = 0.0
    for i in range(len(LENGTHS)):
        alone = model(**feature_alone(features, i))
        torch.testing.assert_close(start[i], alone.start_logits[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(end[i], alone.end_logits[0], atol=1e-5, rtol=0)
        positions = {k: torch.tensor([features[k][i]]) for k in ("start_positions", "end_positions")}
        total = total + model(**feature_alone(features, i), **positions).loss  # (CE start + CE end) / 2 over its tokens
    total.backward()
    assert_same_grads(packed_grads, take_grads(model))


@pytest.mark.parametrize("family", ["Bert", "Roberta", "DistilBert"])
def test_packed_classification_takes_each_cls_and_equals_alone(family):
    features = packing_features(seed=1)
    cls = {k: features[k] for k in ("input_ids", "token_type_ids", "labels")}
    packed = pack_features(cls, MAX_LEN, max_sequences_per_row=3)
    assert max(map(len, packed["feature_index"])) <= 3
    model = tiny_model(f"{family}ForSequenceClassification").train()
    batch = PackedDataCollator(MAX_LEN, 3, position_offset=position_offset(model.config))(packed_rows(packed))
    labels = batch.pop("labels")
    out = model(**batch, output_hidden_states=True)
    logits = sequence_classification_logits(model, out.hidden_states[-1], labels)
    order = [i for row in packed["feature_index"] for i in row]  # labelled slots, row-major
    (PackedSequenceClassificationLoss(model)(out, labels) * len(LENGTHS)).backward()
    packed_grads = take_grads(model)

    total = 0.0
    for k, i in enumerate(order):
        alone = model(**feature_alone(features, i), labels=torch.tensor([features["labels"][i]]))
        torch.testing.assert_close(logits[k], alone.logits[0], atol=1e-5, rtol=0)
        total = total + alone.loss
    total.backward()
    assert_same_grads(packed_grads, take_grads(model))


def test_rows_without_token_type_ids_and_unpacked_labels():
    """`Trainer` drops the columns a forward does not name (DistilBERT: token_type_ids): the collator then sends
    none; and the packed classification loss gives unpacked (evaluation) batches the model's own loss."""
    features = packing_features(seed=2)
    packed = pack_features({k: features[k] for k in ("input_ids", "labels")}, MAX_LEN, max_sequences_per_row=3)
    rows = [{k: v for k, v in row.items() if k != "token_type_ids"} for row in packed_rows(packed)]
    model = tiny_model("DistilBertForSequenceClassification").eval()
    batch = PackedDataCollator(MAX_LEN, 3)(rows)
    assert "token_type_ids" not in batch
    labels = batch.pop("labels")
    assert torch.isfinite(PackedSequenceClassificationLoss(model)(model(**batch, output_hidden_states=True), labels))

    alone = feature_alone(features, 0)
    alone.pop("token_type_ids", None)
    label = torch.tensor([features["labels"][0]])
    out = model(**alone, labels=label)
    torch.testing.assert_close(PackedSequenceClassificationLoss(model)(out, label), out.loss)


def test_bf16_weights_take_a_mask_of_their_type():
    features = packing_features()
    packed = pack_features({k: features[k] for k in ("input_ids", "token_type_ids")}, MAX_LEN)
    slots = max(map(len, packed["feature_index"]))
    for attn in ("eager", "sdpa"):
        model = tiny_model("BertForQuestionAnswering").to(torch.bfloat16)
        model.set_attn_implementation(attn)
        batch = PackedDataCollator(MAX_LEN, slots, mask_dtype=torch.bfloat16)(packed_rows(packed))
        assert batch["attention_mask"].dtype == torch.bfloat16
        start = unpack_logits(model(**batch).start_logits.float(), packed)
        alone = model(**feature_alone(features, 3)).start_logits[0].float()
        torch.testing.assert_close(start[3], alone, atol=0.05, rtol=0.05)  # bf16: the same to its precision


@pytest.fixture(scope="module")
def squad_features(shared_data, minilm_dir):
    import transformers

    sys.path.insert(0, str(REPO_ROOT / "examples" / "question-answering"))
    from utils_qa import load_squad_json, prepare_train_features

    examples = load_squad_json(shared_data / "squad" / "squad-v1.1-dev-articles-00-39.json", articles=slice(0, 4))
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    features = prepare_train_features(examples[:], tokenizer, 384, 128, pad_to_max_length=False)
    return features, tokenizer


def test_real_squad_features_pack_without_loss(squad_features):
    features, tokenizer = squad_features
    count = len(features["input_ids"])
    lengths = [len(ids) for ids in features["input_ids"]]
    assert count > 500 and max(lengths) == 384  # some contexts fill a window
    packed = pack_features(features, 384)
    rows = len(packed["input_ids"])
    assert count / rows >= 1.5, f"{count} features in {rows} rows"
    assert rows <= 11 / 9 * math.ceil(sum(lengths) / 384) + 1  # best fit decreasing's bound over the optimum
    assert sorted(i for row in packed["feature_index"] for i in row) == list(range(count))  # each feature once
    for r in range(rows):
        indices = packed["feature_index"][r]
        assert len(packed["input_ids"][r]) <= 384
        assert packed["input_ids"][r] == [t for i in indices for t in features["input_ids"][i]]
        assert packed["position_ids"][r] == [p for i in indices for p in range(lengths[i])]
        for j, i in enumerate(indices):  # the shifted answer points at the same token
            for name in ("start_positions", "end_positions"):
                assert packed["input_ids"][r][packed[name][r][j]] == features["input_ids"][i][features[name][i]]

    slots = max(map(len, packed["feature_index"]))
    first = packed_rows(packed)[:8]
    batch = PackedDataCollator(384, slots, pad_token_id=tokenizer.pad_token_id)(first)
    mask = batch["attention_mask"][:, 0] == 0  # True where attention is allowed
    for r, row in enumerate(first):
        spans = torch.tensor(row["sequence_lengths"]).cumsum(0).tolist()
        start = 0
        for end in spans:  # a sequence sees itself only; nothing of it sees padding or another sequence
            assert mask[r, start:end, start:end].all() and mask[r, start:end].sum() == (end - start) ** 2
            start = end
    labels = batch["labels"]
    starts = labels[..., 0][labels[..., 0] >= 0]
    assert (
        batch["input_ids"].gather(1, labels[..., 0].clamp(min=0))[labels[..., 0] >= 0] == tokenizer.cls_token_id
    ).all()
    assert len(starts) == sum(len(r["feature_index"]) for r in first)

    # unpack: the packed ids read back as each feature's ids, padded as unpacked features are
    ids_as_logits = torch.tensor([row + [0] * (384 - len(row)) for row in packed["input_ids"]], dtype=torch.float)
    unpacked = unpack_logits(ids_as_logits, packed, pad_to=384, fill=-100.0)
    assert unpacked.shape == (count, 384)
    for i in (0, count // 2, count - 1):
        assert unpacked[i, : lengths[i]].long().tolist() == features["input_ids"][i]
        assert (unpacked[i, lengths[i] :] == -100).all()


def test_packing_rejects_bad_input_with_a_clear_error():
    with pytest.raises(ValueError, match="feature 1 has 40 tokens; packing takes features of 1 to max_seq_length=32"):
        pack_sequences([5, 40], 32)
    with pytest.raises(ValueError, match="feature 0 is padded"):
        pack_features({"input_ids": [[1, 2, 0]], "attention_mask": [[1, 1, 0]]}, 32)
    with pytest.raises(ValueError, match="feature 0: end_positions=3 is outside its 3 tokens"):
        pack_features({"input_ids": [[1, 2, 3]], "start_positions": [0], "end_positions": [3]}, 32)
    packed = pack_features({"input_ids": [[1, 2], [3, 4], [5]]}, 8)
    with pytest.raises(ValueError, match="holds 3 sequences, more than max_sequences_per_row=2"):
        PackedDataCollator(8, 2)(packed_rows(packed))
    with pytest.raises(ValueError, match=r"GPT2ForSequenceClassification \(gpt2\) is not supported; packing runs bert"):
        check_packing_support(tiny_model("GPT2ForSequenceClassification"))  # a 4-D mask would replace its causal one
    bert = tiny_model("BertForQuestionAnswering")
    check_packing_support(bert)
    bert.config._attn_implementation = "flash_attention_2"  # only the name is read: no kernel is loaded
    with pytest.raises(ValueError, match="attn_implementation='flash_attention_2', which takes no 4-D attention"):
        check_packing_support(bert)
    assert pack_sequences([3, 4, 2], 6) == [[1, 2], [0]]  # the docstring's example
    assert pack_sequences([1] * 5, 8, max_sequences_per_row=2) == [[0, 1], [2, 3], [4]]


def test_packed_rows_train_and_predict_through_ipu_trainer(squad_features, tiny_qa_model_dir, tmp_path):
    """The hooks a packed run uses, with no change to the trainer: the collator, `compute_loss_func` and
    `label_names=["labels"]`; `predict` logits of packed rows unpack to the features' layout."""
    import datasets
    import transformers

    from optimum_ipu import IPUConfig
    from optimum_ipu.trainer import IPUTrainer, IPUTrainingArguments

    features, tokenizer = squad_features
    subset = {k: v[:40] for k, v in features.items()}
    packed = pack_features(subset, 384)
    slots = max(map(len, packed["feature_index"]))
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(tiny_qa_model_dir)
    args = IPUTrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=2,
        label_names=["labels"],
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = IPUTrainer(
        model=model,
        ipu_config=IPUConfig(),
        args=args,
        train_dataset=datasets.Dataset.from_dict(packed),
        data_collator=PackedDataCollator(384, slots, pad_token_id=tokenizer.pad_token_id),
        compute_loss_func=packed_question_answering_loss,
    )
    result = trainer.train()
    assert math.isfinite(result.training_loss) and result.training_loss > 0
    prediction = trainer.predict(datasets.Dataset.from_dict(packed))
    start_logits, end_logits = prediction.predictions
    assert start_logits.shape == (len(packed["input_ids"]), 384)
    assert math.isfinite(prediction.metrics["test_loss"])
    unpacked = unpack_logits(start_logits, packed, pad_to=384)
    assert unpacked.shape == (40, 384)
    lengths = [len(ids) for ids in subset["input_ids"]]
    assert all((unpacked[i, lengths[i] :] == -100).all() for i in range(40))
