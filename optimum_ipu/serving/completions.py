"""`POST /v1/completions` and `POST /v1/chat/completions`, as OpenAI's API answers them, on a `text-generation`
pipeline.

Taken: `prompt` (a text or a list of texts) / `messages` (text content; the tokenizer's chat template makes the
prompt), `max_tokens` (default 16, as OpenAI's completions), `temperature` (0: greedy, the tokens of
`model.generate(do_sample=False)`; above 0: sampling with `temperature` and `top_p`, no top-k), `top_p`, `n`
(choices per prompt), `stop` (up to 4 strings; the text stops before the first), `seed` (a seeded request runs in
a batch of its own, so the same seed gives the same text), `stream` (server-sent events; `stream_options:
{"include_usage": true}` adds a last chunk with the token counts). Other OpenAI fields are refused by name unless
they hold their default (`logprobs`, `echo`, `presence_penalty`, ...).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from .batching import Job, cancel_now
from .errors import APIError, bad_request, error_body
from .generation import GenerationSink, cut_at_stop, run_generation_batch
from .tasks import api_error_of

# OpenAI fields taken but without effect here, and those refused unless they hold their default
_IGNORED = {"user", "stream_options", "service_tier", "store", "metadata"}
_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "echo": (False,),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "parallel_tool_calls": (None,),
}


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(16, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(1.0, ge=0, le=2)
    top_p: float | None = Field(1.0, gt=0, le=1)
    n: int | None = Field(1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None


class CompletionRequest(_Sampling):
    """The body of `POST /v1/completions`."""

    prompt: str | list[str] = Field(min_length=1)


class TextContent(BaseModel):
    """A text part of a chat message's content (images and audio are not taken)."""

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message of a chat: its role and its text (a string or a list of text parts)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextContent]


class ChatRequest(_Sampling):
    """The body of `POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)


def _generation_kwargs(req: _Sampling) -> dict[str, Any]:
    """The pipeline's call arguments of a request, after refusing the fields it cannot honour."""
    for name, value in (req.model_extra or {}).items():
        if name in _IGNORED:
            continue
        if name not in _DEFAULTS:
            raise bad_request(name, value, "not a field this server takes; remove it")
        if value not in _DEFAULTS[name]:
            raise bad_request(name, value, "not supported by this server; remove it")
    n, temperature = req.n or 1, 1.0 if req.temperature is None else req.temperature
    if n > 1 and temperature == 0:
        raise bad_request("n", n, "with temperature 0 (greedy) every choice is the same; set temperature > 0 or n 1")
    kwargs: dict[str, Any] = {
        "max_new_tokens": req.max_completion_tokens or req.max_tokens or 16,
        "return_full_text": False,
        "do_sample": temperature > 0,
        "num_return_sequences": n,
    }
    if temperature > 0:  # OpenAI samples with temperature and top_p only: no top-k
        kwargs.update(temperature=temperature, top_p=1.0 if req.top_p is None else req.top_p, top_k=0)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stop) or len(stop) > 4:
        raise bad_request("stop", req.stop, "give up to 4 non-empty strings")
    if stop:
        kwargs["stop_sequence"] = stop
    if req.seed is not None:
        kwargs["seed"] = req.seed
    return kwargs


def add_completion_routes(app: FastAPI, state: Any) -> None:
    """The two generation endpoints on `app` (see the module docstring)."""

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Any:
        state.require_task("/v1/completions")
        state.check_model(req.model)
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        return await _complete(state, request, req, prompts, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request) -> Any:
        state.require_task("/v1/chat/completions")
        state.check_model(req.model)
        if getattr(state.pipe.tokenizer, "chat_template", None) is None:
            raise APIError(
                400,
                f"messages: the tokenizer of {state.model_name!r} has no chat template to make a prompt of them; "
                "use /v1/completions with a prompt, or serve a model whose tokenizer has one",
                "messages",
            )
        messages = [{"role": m.role, "content": _text(m.content)} for m in req.messages]
        return await _complete(state, request, req, [messages], chat=True)


def _text(content: str | list[TextContent]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _check_positions(state: Any, max_new_tokens: int) -> None:
    """A 400 naming `max_tokens` when prompt room + new tokens pass the model's positions (the pipeline pads every
    prompt to its `max_seq_length`)."""
    from ..pipelines.base import position_limit

    limit = position_limit(state.pipe.model.config)
    if limit is not None and state.pipe.max_seq_length + max_new_tokens > limit:
        most = limit - state.pipe.max_seq_length
        raise bad_request(
            "max_tokens",
            max_new_tokens,
            f"give at most {most} (the model's {limit} positions less "
            f"the {state.pipe.max_seq_length} prompt tokens the pipeline pads to)",
        )


async def _complete(state: Any, request: Request, req: _Sampling, prompts: list[Any], chat: bool) -> Any:
    kwargs = _generation_kwargs(req)
    _check_positions(state, kwargs["max_new_tokens"])
    n = kwargs["num_return_sequences"]
    stream = bool(req.stream)
    param = "messages" if chat else "prompt"
    loop = asyncio.get_running_loop()
    sink = GenerationSink(len(prompts), n, loop if stream else None, asyncio.Queue() if stream else None)
    # a seeded request gets a key of its own: it runs alone, so its seed alone decides its tokens
    key = (
        "generate",
        param,
        json.dumps({k: v for k, v in kwargs.items() if k != "seed"}, sort_keys=True),
        uuid.uuid4().hex if "seed" in kwargs else None,
    )
    pipe, size = state.pipe, state.settings.max_batch_size
    runner = lambda jobs: run_generation_batch(pipe, jobs, size, param)  # noqa: E731
    # cancelled (a timeout, a streaming client gone): its rows stop decoding
    # (without a seed, its batch may decode beside others where the model's stages allow it: `Batcher`)
    job = Job(key, prompts, runner, kwargs, sink, on_cancel=sink.cancel, overlaps="seed" not in kwargs)
    stop = kwargs.get("stop_sequence", [])
    meta = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": state.model_name,
    }
    # (a 429 when the queue is full); a request of one choice without a seed joins the running batch where
    # continuous batching is on
    if state.continuous is not None and state.continuous.takes(kwargs):
        future = state.submit_continuous(sink, prompts, kwargs, param)
    else:
        future = state.submit(job)
    if not stream:
        return _response(await state.wait(future, request), stop, chat, meta, state)
    future.add_done_callback(lambda f: sink.queue.put_nowait(("done", f)))
    include_usage = bool((req.stream_options or {}).get("include_usage"))
    events = _stream(state, request, sink, future, stop, chat, meta, include_usage)
    # a client that goes away mid-stream: the events stop (Starlette cancels them), and the request is cancelled
    # (out of the queue, or its rows stop decoding), in the events' own `finally` and, should they never have
    # started, once the response ends
    gone = BackgroundTask(cancel_now, future)  # (a coroutine: in the event loop, where futures are cancelled)
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}, background=gone
    )


def _finish_reason(choice: Any, stopped: bool) -> str:
    return "stop" if stopped or choice.ended else "length"


def _usage(sink: GenerationSink, state: Any) -> dict[str, int]:
    generated = sum(len(c.ids) for c in sink.choices)
    state.metrics.prompt_tokens.inc(sink.prompt_tokens)
    state.metrics.generated_tokens.inc(generated)
    return {
        "prompt_tokens": sink.prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": sink.prompt_tokens + generated,
    }


def _response(sink: GenerationSink, stop: list[str], chat: bool, meta: dict, state: Any) -> dict[str, Any]:
    choices = []
    for index, choice in enumerate(sink.choices):
        text, stopped = cut_at_stop(choice.text, stop)
        entry: dict[str, Any] = {"index": index, "finish_reason": _finish_reason(choice, stopped), "logprobs": None}
        if chat:
            entry["message"] = {"role": "assistant", "content": text}
        else:
            entry["text"] = text
        choices.append(entry)
    kind = "chat.completion" if chat else "text_completion"
    return {**meta, "object": kind, "choices": choices, "usage": _usage(sink, state)}


class _Follower:
    """The text of one streamed choice so far: each token's new text, held back while it may be an incomplete
    character or the start of a stop string; cut at a stop string."""

    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.tokenizer, self.stop = tokenizer, stop
        self.ids: list[int] = []
        self.sent = ""
        self.stopped = False

    def add(self, token: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        text, self.stopped = cut_at_stop(text, self.stop)
        if not self.stopped:
            if text.endswith("\ufffd"):  # a character cut between tokens: wait for its end
                return ""
            held = max((len(s) - 1 for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
            text = text[: len(text) - held] if held else text
        if not text.startswith(self.sent):
            return ""  # a decoding that changed what came before: the final text settles it
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def rest(self, final: str) -> str:
        """What is left to send so that the chunks add up to `final`, the non-streamed text."""
        return final[len(self.sent) :] if final.startswith(self.sent) else ""


def _chunk(meta: dict, chat: bool, index: int, text: str | None, finish: str | None, role: bool = False) -> str:
    if chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}
    body = {**meta, "object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]}
    return f"data: {json.dumps(body)}\n\n"


async def _stream(
    state: Any,
    request: Request,
    sink: GenerationSink,
    future: asyncio.Future,
    stop: list[str],
    chat: bool,
    meta: dict,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The server-sent events of a streamed request: each choice's text as it is generated, then its finish
    reason; the chunks of a choice add up to its non-streamed text. An error after the start is a last event
    with OpenAI's error body."""
    try:
        followers = [_Follower(state.stream_tokenizer, stop) for _ in sink.choices]
        if chat:
            for index in range(len(followers)):
                yield _chunk(meta, chat, index, None, None, role=True)
        while True:
            try:
                event = await asyncio.wait_for(sink.queue.get(), state.time_left(request))
            except asyncio.TimeoutError:
                await cancel_now(future)  # its decoding told to stop before the client reads the 504
                timeout = state.settings.request_timeout
                message = f"no answer within {timeout:g} s (--request-timeout); retry or raise it"
                yield f"data: {json.dumps(error_body(504, message))}\n\n"
                return
            index, value = event
            if index != "done":
                delta = followers[index].add(value)
                if delta:
                    yield _chunk(meta, chat, index, delta, None)
                continue
            result = _outcome(value)
            if isinstance(result, APIError):
                yield f"data: {json.dumps(error_body(result.status, result.message, result.param))}\n\n"
                return
            for index, choice in enumerate(result.choices):
                final, stopped = cut_at_stop(choice.text, stop)
                rest, finish = followers[index].rest(final), _finish_reason(choice, stopped or followers[index].stopped)
                yield _chunk(meta, chat, index, rest or None, finish)
            usage = _usage(result, state)
            if include_usage:
                kind = "chat.completion.chunk" if chat else "text_completion"
                yield f"data: {json.dumps({**meta, 'object': kind, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
            return
    finally:
        future.cancel()  # (nothing once it has finished) the client went away: free its place


def _outcome(future: asyncio.Future) -> Any:
    """The filled `GenerationSink` of a finished job, or the `APIError` to send instead."""
    if future.cancelled():
        return APIError(500, "the request was cancelled")
    error = future.exception()
    result = future.result() if error is None else error
    return api_error_of(result) if isinstance(result, BaseException) else result
