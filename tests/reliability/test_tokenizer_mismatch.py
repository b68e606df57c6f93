"""A tokenizer that is not the model's (its ids past the model's embeddings) is one line saying so, on every
backend, instead of an error from inside ONNX Runtime's embedding kernel (issue 42, item 13)."""

from __future__ import annotations

import pytest
import transformers

from optimum_ipu import pipeline

from ..tiny_models import tiny_model


@pytest.mark.parametrize("backend", ["eager", "onnxruntime"])
def test_token_ids_past_the_embeddings_name_the_tokenizer(backend, minilm_dir, reliability):
    model = tiny_model("BertForSequenceClassification")  # 99 embeddings; MiniLM's tokenizer has 30,522 tokens
    classify = pipeline(
        "text-classification", model, tokenizer=transformers.AutoTokenizer.from_pretrained(minilm_dir), backend=backend
    )
    reliability.expect_clear_error(
        lambda: classify("a sentence of ordinary words"), ("tokenizer", "does not match the model", "99")
    )


@pytest.mark.parametrize("device", ["cuda:7", 7, "mps", "gpu"])
def test_a_device_this_machine_lacks_is_one_line(device, reliability):
    """`device="cuda:7"` without that GPU stopped in torch's "Torch not compiled with CUDA enabled" (item 11)."""
    import torch

    if torch.cuda.device_count() > 7 or (device == "mps" and torch.backends.mps.is_available()):
        pytest.skip("this machine has the device")
    model = tiny_model("BertForSequenceClassification")
    reliability.expect_clear_error(lambda: pipeline("text-classification", model, device=device), ("device", "got"))
