"""The ASGI app of `optimum-ipu serve`: one `pipeline()` object behind HTTP.

`create_app(pipe, settings)` returns a FastAPI app that answers

- `GET /health`: 200 once the model has answered a warm-up request, 503 before and while draining;
- `GET /metrics`: Prometheus text (`ServerMetrics`);
- `GET /v1/models`, `GET /v1/models/{name}`: the one model served, as OpenAI lists models;
- `POST /v1/pipeline/{task}`: any task, with the pipeline's own arguments and outputs (`{"inputs": ..., **kwargs}`);
- the OpenAI endpoints of the task: `/v1/completions` and `/v1/chat/completions` (text generation),
  `/v1/embeddings` (feature extraction), `/v1/audio/transcriptions` (speech recognition).

Every request passes `ServerMiddleware`: refused with 503 while draining, 413 past the body limit, counted in
flight and in the metrics by endpoint and status. Requests reach the model through the `Batcher`: 429 (with
`Retry-After`) when its queue is full, 504 past `request_timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .batching import Batcher, Job, QueueFull, cancel_now
from .continuous import ContinuousGeneration
from .errors import APIError, error_response, install_error_handlers
from .joined import JoinedGeneration
from .metrics import ServerMetrics
from .settings import ServeSettings, default_max_batch_size
from .tasks import (
    INPUT_ERRORS,
    InputError,
    api_error_of,
    check_call_arguments,
    decode_input,
    run_pipeline_batch,
    to_jsonable,
    warmup_requests,
)

logger = logging.getLogger(__name__)

# the OpenAI endpoints each task answers (every task also answers /v1/pipeline/<task>)
OPENAI_ENDPOINTS = {
    "text-generation": ("/v1/completions", "/v1/chat/completions"),
    "feature-extraction": ("/v1/embeddings",),
    "sentence-embeddings": ("/v1/embeddings",),
    "automatic-speech-recognition": ("/v1/audio/transcriptions",),
}
_UNCOUNTED = ("/health", "/metrics")  # probes: neither refused while draining nor counted as requests
_START = "optimum_ipu.start"


def continuous_engine(pipe: Any, settings: ServeSettings) -> ContinuousGeneration | JoinedGeneration:
    """`--continuous-batching`'s engine: `--continuous-batching-engine`, where `auto` is `transformers`' managers in
    one process and ours (`serving/joined.py`) across the processes of a `torchrun` job."""
    engine = settings.continuous_batching_engine
    if engine == "auto":
        engine = "optimum-ipu" if hasattr(pipe, "lockstep") else "transformers"
    kind = JoinedGeneration if engine == "optimum-ipu" else ContinuousGeneration
    return kind(pipe, settings.max_batch_size)


class ServerState:
    """What the endpoints share: the pipeline, the settings, the metrics, the batcher, and the server's life
    (warm, draining, requests in flight)."""

    def __init__(self, pipe: Any, settings: ServeSettings, metrics: ServerMetrics) -> None:
        self.task: str = pipe.task
        if settings.max_batch_size is None:  # per task and device (`default_max_batch_size`)
            device = getattr(getattr(pipe, "device", None), "type", "cpu")
            settings = dataclasses.replace(settings, max_batch_size=default_max_batch_size(self.task, device))
            logger.info("--max-batch-size %d (the default for %s on %s)", settings.max_batch_size, self.task, device)
        self.pipe, self.settings, self.metrics = pipe, settings, metrics
        self.model_name = settings.model_name
        # generation batches overlap where the model's stages decode several at once (`LeadingPipeline.overlaps`)
        in_flight = settings.batches_in_flight if getattr(pipe, "overlaps", False) else 1
        self.batcher = Batcher(
            settings.max_batch_size, settings.batch_wait_ms / 1000, settings.max_queue, metrics, self.task, in_flight
        )
        self.continuous = continuous_engine(pipe, settings) if settings.continuous_batching else None
        self.warm = False
        self.warmup_error: str | None = None
        self.draining = False
        self.in_flight = 0
        self.created = int(time.time())
        for family in (metrics.batch_size, metrics.batch_seconds):  # shown from the start, at zero
            family.labels(self.task)

    def stage_loss(self) -> str | None:
        """Under `torchrun`: why the stage processes are no longer in step (a failed collective, a silent
        heartbeat), or None; always None in one process."""
        check = getattr(self.pipe, "check_stages", None)
        return check() if check is not None else None

    @functools.cached_property
    def stream_tokenizer(self) -> Any:
        """A copy of the pipeline's tokenizer for decoding streamed tokens in the event loop: a fast tokenizer used
        from two threads at once (the worker's next batch sets its truncation) fails with "Already borrowed"."""
        return copy.deepcopy(self.pipe.tokenizer)

    @property
    def idle(self) -> bool:
        """No request in flight and none waiting or computing."""
        return self.in_flight == 0 and self.batcher.idle and (self.continuous is None or not self.continuous.in_flight)

    def begin_draining(self) -> None:
        """Refuse new requests (503) and say unhealthy; those in flight finish (graceful shutdown)."""
        if not self.draining:
            logger.info("draining: new requests get 503; %d in flight finish first", self.in_flight)
        self.draining = True

    def check_model(self, name: Any) -> None:
        """A 404 naming the served model when a request names another (no name: the served one)."""
        if name is not None and name != self.model_name:
            raise APIError(404, f"model {name!r} is not served here; this server serves {self.model_name!r}", "model")

    def require_task(self, endpoint: str) -> None:
        """A 404 when the served task does not answer `endpoint`, naming what it answers."""
        if endpoint in OPENAI_ENDPOINTS.get(self.task, ()):
            return
        answers = ", ".join([*OPENAI_ENDPOINTS.get(self.task, ()), f"/v1/pipeline/{self.task}"])
        needs = next(task for task, endpoints in OPENAI_ENDPOINTS.items() if endpoint in endpoints)
        raise APIError(
            404,
            f"{endpoint}: this server serves {self.model_name!r} for {self.task}, which answers {answers}; "
            f"{endpoint} needs a {needs} model (optimum-ipu serve MODEL --task {needs})",
        )

    def submit(self, job: Job) -> asyncio.Future:
        """Queue `job`; the future of its result. A 429 (with `Retry-After`) when the queue is full."""
        try:
            return self.batcher.submit(job)
        except QueueFull:
            raise self._queue_full(f"the queue holds {self.settings.max_queue} requests") from None

    def submit_continuous(self, sink: Any, prompts: list[Any], kwargs: dict[str, Any], param: str) -> asyncio.Future:
        """Hand a generation request to a continuous batching manager (`serving/continuous.py`); the future
        of its filled sink. A 429 past `--max-queue` requests in flight there, a 400 for a prompt the pipeline
        refuses."""
        if self.continuous.in_flight >= self.settings.max_queue:
            raise self._queue_full(f"{self.settings.max_queue} requests are in flight")
        try:
            return self.continuous.submit(sink, prompts, kwargs, param)
        except (*INPUT_ERRORS, InputError) as err:
            raise api_error_of(err if isinstance(err, InputError) else InputError(param, f"{param}: {err}")) from None

    def _queue_full(self, held: str) -> APIError:
        """The 429 (with `Retry-After`) of a full queue, counted; `held` says what is held."""
        self.metrics.rejected.labels("queue_full").inc()
        return APIError(429, f"{held} (--max-queue); retry after a second", headers={"Retry-After": "1"})

    async def run(self, job: Job, request: Request) -> Any:
        """Queue `job`, wait for its result within the request's time left; 429 when the queue is full, 504 past
        the timeout (a computation already running finishes, its result dropped, unless the job's `on_cancel` stops
        it), the job's own error otherwise."""
        return await self.wait(self.submit(job), request)

    async def wait(self, future: asyncio.Future, request: Request) -> Any:
        """The result of a submitted request's `future` within the request's time left (see `run`)."""
        try:
            result = await asyncio.wait_for(asyncio.shield(future), self.time_left(request))
        except asyncio.TimeoutError:
            await cancel_now(future)  # still waiting: dropped from the queue; computing: its result is dropped
            self.metrics.rejected.labels("timeout").inc()
            raise APIError(
                504, f"no answer within {self.settings.request_timeout:g} s (--request-timeout); retry or raise it"
            ) from None
        except Exception as err:  # the job's own error (an input the pipeline refused: 400)
            raise api_error_of(err) from None
        return result

    def time_left(self, request: Request) -> float:
        """Seconds left of the request's `request_timeout` (counted from its arrival)."""
        start = request.scope.get(_START, time.monotonic())
        return max(0.0, self.settings.request_timeout - (time.monotonic() - start))

    async def warm_up(self) -> None:
        """Answer one request of the task through the same path as clients' (the first call builds buckets,
        exports or compiles); only then does /health say 200."""
        start = time.perf_counter()
        try:
            for items, kwargs in warmup_requests(self.pipe, self.settings.max_batch_size):
                job = Job(("warmup",), items, self._pipeline_runner("inputs"), kwargs)
                result = await self.batcher.run_now(job)
                if isinstance(result, BaseException):
                    raise result
            if self.continuous is not None:  # its manager's warm-up, before /health says ready
                await asyncio.get_running_loop().run_in_executor(None, self.continuous.start)
        except Exception as err:  # noqa: BLE001 (reported on /health and in the log; the server stays up)
            self.warmup_error = f"{type(err).__name__}: {err}"
            logger.exception("the warm-up request failed; /health answers 503")
            return
        self.warm = True
        logger.info(
            "warm-up request answered in %.2f s: serving %s (%s)",
            time.perf_counter() - start,
            self.model_name,
            self.task,
        )

    def _pipeline_runner(self, param: str) -> Any:
        pipe, size = self.pipe, self.settings.max_batch_size
        return lambda jobs: run_pipeline_batch(pipe, jobs, size, param)


class ServerMiddleware:
    """Refuses requests while draining (503) and bodies past the limit (413), and counts every request: in flight,
    and in the metrics by endpoint (the route's path) and status."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _UNCOUNTED:
            await self.app(scope, receive, send)
            return
        state = self.state
        scope[_START] = time.monotonic()
        status = {"code": 500}

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        state.in_flight += 1
        state.metrics.in_flight.inc()
        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send_counted)
            else:
                await self.app(scope, self._limited(receive), send_counted)
        finally:
            state.in_flight -= 1
            state.metrics.in_flight.dec()
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            state.metrics.requests.labels(endpoint, str(status["code"])).inc()
            state.metrics.latency.labels(endpoint).observe(time.monotonic() - scope[_START])

    def _refusal(self, scope: Scope) -> Response | None:
        """The response of a request refused before it is read: 503 while draining, 413 for a declared body over
        the limit."""
        if self.state.draining:
            self.state.metrics.rejected.labels("draining").inc()
            return error_response(
                503,
                "the server is shutting down; send the request to another replica",
                headers={"Connection": "close", "Retry-After": "1"},
            )
        limit = self.state.settings.max_body_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                self.state.metrics.rejected.labels("body_too_large").inc()
                return _too_large(int(value), limit)
        return None

    def _limited(self, receive: Receive) -> Receive:
        """`receive` that stops a body (sent without a length, chunked) once it passes the limit."""
        limit, seen = self.state.settings.max_body_bytes, [0]

        async def receive_limited() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > limit:
                    self.state.metrics.rejected.labels("body_too_large").inc()
                    raise APIError(413, _too_large_message(seen[0], limit), "body")
            return message

        return receive_limited


def _too_large_message(size: int, limit: int) -> str:
    return f"body: {size} bytes, more than the limit of {limit} (--max-body-bytes); send less or raise the limit"


def _too_large(size: int, limit: int) -> Response:
    return error_response(413, _too_large_message(size, limit), "body", headers={"Connection": "close"})


def create_app(pipe: Any, settings: ServeSettings, metrics: ServerMetrics | None = None) -> FastAPI:
    """The server's ASGI app around a `pipeline()` object (see the module docstring).

    Args:
        pipe (`StaticBatchingPipeline`): what `optimum_ipu.pipelines.pipeline(...)` returned; every request is
            handed to it.
        settings (`ServeSettings`): the limits and the served name (`host` / `port` are `serve()`'s).
        metrics (`ServerMetrics`, *optional*): where to count (a new registry by default).

    Returns:
        `FastAPI`: the app; `app.state.server` is its `ServerState` (`begin_draining()`, `warm`, `idle`).
    """
    state = ServerState(pipe, settings, metrics or ServerMetrics())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        state.batcher.start()
        warmup = asyncio.get_running_loop().create_task(state.warm_up())
        try:
            yield
        finally:
            warmup.cancel()
            await state.batcher.stop()
            if state.continuous is not None:
                await asyncio.get_running_loop().run_in_executor(None, state.continuous.stop)

    app = FastAPI(title="optimum-ipu serve", lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)
    app.add_middleware(ServerMiddleware, state=state)
    _add_service_routes(app, state)
    _add_pipeline_route(app, state)
    from .openai_api import add_openai_routes  # the OpenAI endpoints of the task

    add_openai_routes(app, state)
    return app


def _add_service_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        lost = state.stage_loss()
        if lost is not None:
            return error_response(503, f"a stage process is lost: {lost}")
        if state.draining:
            return error_response(503, "draining: the server is shutting down")
        if not state.warm:
            why = f"the warm-up request failed: {state.warmup_error}" if state.warmup_error else "warming up"
            return error_response(503, why)
        return JSONResponse({"status": "ok", "model": state.model_name, "task": state.task})

    @app.get("/metrics")
    async def metrics() -> Response:
        state.metrics.queue_depth.set(state.batcher.depth)
        if state.continuous is not None:
            state.metrics.continuous_requests.set(state.continuous.in_flight)
            rows = getattr(state.continuous, "rows", None)  # (this project's engine; the managers keep theirs)
            if rows is not None:
                running, waiting = rows()
                state.metrics.continuous_rows.labels("running").set(running)
                state.metrics.continuous_rows.labels("waiting").set(waiting)
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    def card() -> dict[str, Any]:
        return {
            "id": state.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "optimum-ipu",
            "task": state.task,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        state.check_model(name)
        return card()


def _add_pipeline_route(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/pipeline/{task}")
    async def run_pipeline(task: str, request: Request) -> JSONResponse:
        from ..pipelines import check_task

        try:
            canonical = check_task(task)[0]
        except (KeyError, ValueError):
            canonical = None
        if canonical != state.task:
            raise APIError(
                404,
                f"task {task!r} is not served here; this server runs {state.model_name!r} for {state.task}: "
                f"POST /v1/pipeline/{state.task}",
                "task",
            )
        body = await _json_object(request)
        state.check_model(body.pop("model", None))
        if "inputs" not in body:
            raise APIError(400, 'inputs: missing; send {"inputs": ..., plus the pipeline\'s arguments}', "inputs")
        inputs = body.pop("inputs")
        check_call_arguments(state.pipe, body)
        many = isinstance(inputs, list)
        if many and not inputs:
            raise APIError(400, "inputs: got []; send one input or a non-empty list", "inputs")
        items = [
            decode_input(state.task, x, f"inputs.{i}" if many else "inputs")
            for i, x in enumerate(inputs if many else [inputs])
        ]
        key = ("pipeline", _settings_key(body))
        job = Job(key, items, state._pipeline_runner("inputs"), body)
        results = await state.run(job, request)
        return JSONResponse(to_jsonable(results if many else results[0]))


async def _json_object(request: Request) -> dict[str, Any]:
    """The request's JSON object body; a 400 naming `body` otherwise."""
    import json

    raw = await request.body()
    try:
        body = json.loads(raw or b"null")
    except ValueError as err:
        raise APIError(400, f"body: not valid JSON ({err}); send a JSON object", "body") from None
    if not isinstance(body, dict):
        raise APIError(400, f"body: got a JSON {type(body).__name__}; send a JSON object", "body")
    return body


def _settings_key(kwargs: dict[str, Any]) -> str:
    """A hashable key of a call's settings: requests with equal settings share a pipeline call."""
    import json

    return json.dumps(kwargs, sort_keys=True, default=repr)
