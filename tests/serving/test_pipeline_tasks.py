"""`POST /v1/pipeline/<task>` for the tasks without an OpenAI endpoint: each a tiny model behind a real server,
its answers equal to the same pipeline called in-process with the same inputs and arguments (a list of inputs: the
list call's results; one input: its element). Images and audio travel base64-encoded; a path is refused."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import torch
import transformers

from ..tiny_models_vision_speech import PIPELINE_WAV2VEC2, save_vit_classifier
from .conftest import assert_error, running_server

CONTEXT = "The ship was commanded by Captain Hartwell. It sailed from Bristol in 1820."


def _text_pipe(tiny_pretrained, tiny_qa_model_dir, task: str, class_name: str):
    from optimum_ipu.pipelines import pipeline

    if task == "question-answering":
        return pipeline(task, model=str(tiny_qa_model_dir), backend="eager")
    folder = str(tiny_pretrained(class_name))
    if task != "zero-shot-classification":
        return pipeline(task, model=folder, backend="eager")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder)
    model.config.id2label = {0: "contradiction", 1: "neutral", 2: "entailment"}  # the label zero-shot reads
    model.config.label2id = {v: k for k, v in model.config.id2label.items()}
    return pipeline(task, model=model, tokenizer=folder, backend="eager")


def _post(url: str, task: str, body: dict) -> httpx.Response:
    response = httpx.post(f"{url}/v1/pipeline/{task}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response


CASES = [
    (
        "question-answering",
        "BertForQuestionAnswering",
        [{"question": "Who commanded the ship?", "context": CONTEXT}, {"question": "From where?", "context": CONTEXT}],
        {"top_k": 2},
    ),
    (
        "token-classification",
        "BertForTokenClassification",
        ["Hartwell sailed from Bristol.", "Rain in Paris."],
        {"aggregation_strategy": "simple"},
    ),
    ("fill-mask", "BertForMaskedLM", ["The ship sailed from [MASK].", "It rained in [MASK] today."], {"top_k": 3}),
    (
        "zero-shot-classification",
        "BertForSequenceClassification",
        ["The ship sailed at dawn.", "Prices rose again."],
        {"candidate_labels": ["travel", "money", "weather"]},
    ),
    (
        "summarization",
        "T5ForConditionalGeneration",
        [CONTEXT, "Rain fell all day over the harbour."],
        {"max_new_tokens": 6},
    ),
    (
        "translation_en_to_ro",
        "T5ForConditionalGeneration",
        ["The house is wonderful.", "Good morning."],
        {"max_new_tokens": 5},
    ),
]


@pytest.mark.parametrize("task, class_name, inputs, kwargs", CASES, ids=[c[0] for c in CASES])
def test_text_tasks_equal_the_pipeline(tiny_pretrained, tiny_qa_model_dir, task, class_name, inputs, kwargs):
    pipe = _text_pipe(tiny_pretrained, tiny_qa_model_dir, task, class_name)
    with running_server(pipe) as (url, _):
        many = _post(url, task, {"inputs": inputs, **kwargs}).json()
        one = _post(url, task, {"inputs": inputs[0], **kwargs}).json()
    # (the server's calls: each request's inputs in one host batch, so the same rounding as these calls)
    assert many == _json(pipe(inputs, batch_size=len(inputs), **kwargs))
    assert one == _json(pipe([inputs[0]], batch_size=1, **kwargs)[0])


def _json(value):
    """Pipeline outputs as JSON gives them back (numpy scalars as numbers, tuples as lists)."""
    import json

    from optimum_ipu.serving.tasks import to_jsonable

    return json.loads(json.dumps(to_jsonable(value)))


@pytest.fixture(scope="module")
def image_pipe(tmp_path_factory):
    from optimum_ipu.pipelines import pipeline

    folder = save_vit_classifier(tmp_path_factory.mktemp("vit"))
    return pipeline("image-classification", model=folder)


def test_image_classification_takes_base64_images(image_pipe):
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)) for _ in range(2)]
    encoded = []
    for image in images:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        encoded.append(base64.b64encode(buffer.getvalue()).decode())
    with running_server(image_pipe) as (url, _):
        many = _post(url, "image-classification", {"inputs": encoded, "top_k": 2}).json()
        data_url = _post(url, "image-classification", {"inputs": "data:image/png;base64," + encoded[0]}).json()
        path = httpx.post(f"{url}/v1/pipeline/image-classification", json={"inputs": ["/etc/passwd"]})
        not_png = base64.b64encode(b"xx").decode()
        broken = httpx.post(f"{url}/v1/pipeline/image-classification", json={"inputs": not_png})
    assert many == _json(image_pipe(images, top_k=2))
    assert data_url == _json(image_pipe([images[0]])[0])
    assert_error(path, 400, "inputs.0", "'/etc/passwd'", "base64", "reads no path")
    assert_error(broken, 400, "inputs", "not an image")


def test_audio_classification_takes_base64_audio(tmp_path, shared_data):
    from optimum_ipu.pipelines import pipeline

    torch.manual_seed(0)
    config = transformers.Wav2Vec2Config(**PIPELINE_WAV2VEC2, num_labels=3)
    transformers.Wav2Vec2ForSequenceClassification(config).save_pretrained(tmp_path)
    transformers.Wav2Vec2FeatureExtractor(return_attention_mask=True).save_pretrained(tmp_path)
    pipe = pipeline("audio-classification", model=str(tmp_path))
    clips = [shared_data / "audio" / "fsdd" / "test" / name for name in ("0_george_0.wav", "9_yweweler_4.wav")]
    encoded = [base64.b64encode(c.read_bytes()).decode() for c in clips]
    with running_server(pipe) as (url, _):
        many = _post(url, "audio-classification", {"inputs": encoded, "top_k": 2}).json()
        bad = httpx.post(f"{url}/v1/pipeline/audio-classification", json={"inputs": {"sampling": 1}})
    assert many == _json(pipe([c.read_bytes() for c in clips], top_k=2))
    assert_error(bad, 400, "inputs", "base64")
