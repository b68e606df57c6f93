"""OpenAI's `POST /v1/embeddings` and `POST /v1/audio/transcriptions` (and, from `completions`, the two
generation endpoints), each on the pipeline of its task.

- Embeddings: a `sentence-embeddings` pipeline (pooled as the model's sentence-transformers folder says), or a
  `feature-extraction` pipeline with `pooling="mean", normalize=True` (sentence-transformers'
  sentence embeddings: the token vectors averaged over the attention mask, L2-normalised); `encoding_format`
  `"float"` or `"base64"` (little-endian float32, what the `openai` client asks for by default).
- Transcriptions: an `automatic-speech-recognition` pipeline (Whisper, CTC models) on the uploaded file
  (multipart), decoded by the pipeline with `soundfile` (WAV, FLAC, OGG; no FFmpeg); `response_format` `"json"`
  or `"text"`, `language` passed to Whisper's `generate()`.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import PlainTextResponse

from .batching import Job
from .completions import add_completion_routes
from .errors import APIError, bad_request
from .tasks import run_pipeline_batch

_EMBEDDING_FORMATS = ("float", "base64")
_TRANSCRIPTION_FORMATS = ("json", "text")


class EmbeddingRequest(BaseModel):
    """The body of `POST /v1/embeddings`."""

    model_config = ConfigDict(extra="forbid")

    input: str | list[str] = Field(min_length=1)
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


def add_openai_routes(app: FastAPI, state: Any) -> None:
    """The OpenAI endpoints on `app` (each answers 404 naming what the served task answers, for another task)."""
    add_completion_routes(app, state)

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, request: Request) -> dict[str, Any]:
        state.require_task("/v1/embeddings")
        state.check_model(req.model)
        if req.encoding_format not in _EMBEDDING_FORMATS:
            raise bad_request("encoding_format", req.encoding_format, f"give one of {', '.join(_EMBEDDING_FORMATS)}")
        if req.dimensions is not None:
            raise bad_request("dimensions", req.dimensions, "this server returns the model's own size; remove it")
        texts = [req.input] if isinstance(req.input, str) else req.input
        if any(not t for t in texts):
            raise bad_request("input", req.input, "give non-empty texts")
        # sentence-embeddings pools as the model's folder says; feature-extraction as sentence-transformers' default
        kwargs = {} if state.task == "sentence-embeddings" else {"pooling": "mean", "normalize": True}
        pipe, size = state.pipe, state.settings.max_batch_size
        job = Job(("embeddings",), texts, lambda jobs: _embed_batch(pipe, jobs, size), kwargs)
        vectors, tokens = await state.run(job, request)
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(v, req.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        state.metrics.prompt_tokens.inc(tokens)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": state.model_name, "usage": usage}

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Any:
        state.require_task("/v1/audio/transcriptions")
        audio, fields = await _transcription_form(request)
        state.check_model(fields.get("model"))
        response_format = fields.get("response_format") or "json"
        if response_format not in _TRANSCRIPTION_FORMATS:
            raise bad_request("response_format", response_format, f"give {' or '.join(_TRANSCRIPTION_FORMATS)}")
        kwargs = _transcription_kwargs(fields)
        pipe, size = state.pipe, state.settings.max_batch_size
        runner = lambda jobs: run_pipeline_batch(pipe, jobs, size, "file")  # noqa: E731
        key = ("transcription", json.dumps(kwargs, sort_keys=True))
        (result,) = await state.run(Job(key, [audio], runner, kwargs), request)
        text = result["text"]
        return PlainTextResponse(text) if response_format == "text" else {"text": text}


def _embed_batch(pipe: Any, jobs: list[Job], max_batch_size: int) -> list[Any]:
    """The jobs' texts as one pipeline call; each job gets `(vectors, prompt tokens)`."""
    results = run_pipeline_batch(pipe, jobs, max_batch_size, "input")
    out = []
    for job, result in zip(jobs, results, strict=True):
        if isinstance(result, BaseException):
            out.append(result)
            continue
        # the tokens each text was cut to (the pipeline truncates to its max_seq_length)
        lengths = pipe.tokenizer(job.items, truncation=True, max_length=pipe.max_seq_length)["input_ids"]
        out.append((result, sum(len(ids) for ids in lengths)))
    return out


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


async def _transcription_form(request: Request) -> tuple[bytes, dict[str, str]]:
    """The uploaded audio's bytes and the form's other fields; a 400 naming `file` when it is missing or is no
    audio `soundfile` can read."""
    import soundfile

    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise bad_request("file", content_type or None, "send multipart/form-data with the audio as 'file'")
    form = await request.form()
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise APIError(400, "file: missing; send the audio file as the multipart field 'file'", "file")
    data = await upload.read()
    try:
        soundfile.info(io.BytesIO(data))
    except Exception as err:  # noqa: BLE001 (soundfile raises its own error types, by version)
        name = upload.filename or "the upload"
        raise bad_request(
            "file",
            name,
            f"not audio soundfile can read ({type(err).__name__}); send WAV, FLAC or "
            "OGG (MP3 and M4A need FFmpeg, which the server does not use)",
        ) from None
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    return data, fields


def _transcription_kwargs(fields: dict[str, str]) -> dict[str, Any]:
    """The pipeline's call arguments from the form: `language` for Whisper; `prompt`, a non-zero `temperature`
    and timestamps are refused by name (not done here yet)."""
    if fields.get("prompt"):
        raise bad_request("prompt", fields["prompt"], "prompts are not supported by this server yet; remove it")
    temperature = fields.get("temperature")
    try:
        nonzero = temperature not in (None, "") and float(temperature) != 0
    except ValueError:
        raise bad_request("temperature", temperature, "give a number (only 0 is supported: no sampling)") from None
    if nonzero:
        raise bad_request("temperature", temperature, "only 0 (no sampling) is supported; remove it")
    for name in ("timestamp_granularities[]", "timestamp_granularities"):
        if fields.get(name):
            raise bad_request(name, fields[name], "timestamps are not supported by this server yet; remove it")
    language = fields.get("language")
    return {"generate_kwargs": {"language": language}} if language else {}
