"""Packed inference (`optimum_ipu.packing.predict_packed_*`): several texts a row give each text's logits as the
text alone does, for the packing families, with Optimum Graphcore's `max_seq_per_pack`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from optimum_ipu.packing import predict_packed_classification, predict_packed_question_answering

from .local_tokenizers import save_tiny_pretrained

SENTENCES = [
    "a gripping film",
    "the plot goes nowhere and the actors seem to know it",
    "fine",
    "an uneven but often funny look at a family",
    "i would not watch it again",
    "beautifully shot",
    "two hours i will not get back",
]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tokenizer_for):
    def load(class_name: str, family: str, **config):
        path = tmp_path_factory.mktemp(class_name)
        save_tiny_pretrained(path, class_name, tokenizer_for(family), **config)
        model = getattr(transformers, class_name).from_pretrained(path).eval()
        return model, transformers.AutoTokenizer.from_pretrained(path)

    return load


def _alone(model, tokenizer, texts, pairs=None):
    rows = []
    for i, text in enumerate(texts):
        encoded = tokenizer(text, pairs[i] if pairs else None, return_tensors="pt")
        with torch.no_grad():
            rows.append(model(**encoded).logits[0].numpy())
    return np.stack(rows)


@pytest.mark.parametrize(
    ("class_name", "family"),
    [
        ("BertForSequenceClassification", "bert"),
        ("RobertaForSequenceClassification", "roberta"),
        ("DistilBertForSequenceClassification", "bert"),
    ],
)
def test_packed_classification_equals_each_text_alone(classifier, class_name, family):
    model, tokenizer = classifier(class_name, family)
    packed = predict_packed_classification(model, tokenizer, SENTENCES, max_seq_length=48, max_sequences_per_row=3)
    alone = _alone(model, tokenizer, SENTENCES)
    assert packed.shape == (len(SENTENCES), model.config.num_labels)
    np.testing.assert_allclose(packed, alone, atol=1e-5, rtol=1e-4)
    assert not np.allclose(alone[0], alone[1])  # texts differ, so a mix-up of rows would show


def test_packed_pairs_and_one_text_a_row(classifier):
    model, tokenizer = classifier("BertForSequenceClassification", "bert")
    pairs = list(reversed(SENTENCES))
    packed = predict_packed_classification(model, tokenizer, SENTENCES, pairs, max_seq_length=64)
    np.testing.assert_allclose(packed, _alone(model, tokenizer, SENTENCES, pairs), atol=1e-5, rtol=1e-4)
    one = predict_packed_classification(model, tokenizer, SENTENCES, max_sequences_per_row=1, batch_size=2)
    np.testing.assert_allclose(one, _alone(model, tokenizer, SENTENCES), atol=1e-5, rtol=1e-4)


def test_packed_question_answering_equals_each_feature_alone(classifier):
    model, tokenizer = classifier("BertForQuestionAnswering", "bert", num_labels=2)
    questions = ["who shot it?", "how long is it?", "is it funny?"]
    features = tokenizer(questions, SENTENCES[:3], truncation=True, max_length=40)
    starts, ends = predict_packed_question_answering(
        model, dict(features), max_seq_length=40, pad_token_id=tokenizer.pad_token_id
    )
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        encoded = tokenizer(questions[i], SENTENCES[i], return_tensors="pt")
        with torch.no_grad():
            out = model(**encoded)
        assert start.shape == (encoded["input_ids"].shape[1],)
        np.testing.assert_allclose(start, out.start_logits[0].numpy(), atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(end, out.end_logits[0].numpy(), atol=1e-5, rtol=1e-4)


def test_a_family_that_does_not_pack_is_one_clear_error(classifier):
    model, tokenizer = classifier("GPT2ForSequenceClassification", "gpt2")
    with pytest.raises(ValueError, match="pack"):
        predict_packed_classification(model, tokenizer, SENTENCES[:2])
