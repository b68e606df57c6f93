"""Handing requests to a `pipeline()` object: the inputs a JSON body can carry, the call's arguments, a batch of
requests as one pipeline call, and outputs made JSON.

Nothing here knows a model: what a task takes and returns is its pipeline's (`optimum_ipu.pipelines`); this module
only moves inputs and outputs across HTTP. Files travel as base64 (images, audio): the server never reads a path or
fetches a URL a client names (a request could otherwise read the server's files or reach its network).
"""

from __future__ import annotations

import base64
import binascii
import inspect
import io
import json
import math
import re
from typing import Any

import numpy as np
import torch

from ..pipelines.images import ImageDecodingError, check_image_size
from .batching import Job
from .errors import APIError, bad_request

IMAGE_TASKS = ("image-classification",)
AUDIO_TASKS = ("audio-classification", "automatic-speech-recognition")
# the call arguments the server sets itself
SERVER_ARGUMENTS = ("batch_size", "num_workers")
# what a pipeline raises for an input or argument it refuses (a 400 for the request that sent it)
INPUT_ERRORS = (ValueError, TypeError, KeyError, IndexError)


class InputError(Exception):
    """A request's input or argument refused by the pipeline: a 400 naming `param`."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def call_arguments(pipe: Any) -> tuple[set[str], bool]:
    """`(names, any)`: the arguments the pipeline's call takes (its `_sanitize_parameters`), and whether it takes
    any keyword (generation pipelines pass the rest to `generate()`)."""
    parameters = inspect.signature(pipe._sanitize_parameters).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    names = {n for n, p in parameters.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    return names, takes_any


def check_call_arguments(pipe: Any, kwargs: dict[str, Any]) -> None:
    """A 400 naming the first argument the pipeline's call does not take, or that the server sets itself."""
    names, takes_any = call_arguments(pipe)
    for key, value in kwargs.items():
        if key in SERVER_ARGUMENTS:
            raise bad_request(key, value, "the server sets it (optimum-ipu serve --max-batch-size); remove it")
        if not takes_any and key not in names:
            accepted = ", ".join(sorted(names)) or "none"
            raise bad_request(key, value, f"not an argument of the {pipe.task} pipeline; it takes: {accepted}")
    try:
        json.dumps(kwargs, sort_keys=True)
    except (TypeError, ValueError) as err:  # (cannot happen for a parsed JSON body; a guard for Python callers)
        raise bad_request("parameters", kwargs, f"send JSON values ({err})") from None


def decode_input(task: str, value: Any, param: str = "inputs") -> Any:
    """One input of a JSON body as the pipeline takes it: text and objects as they are; for image tasks a base64
    string (or data URL) becomes a PIL image, for audio tasks the file's bytes (the pipeline decodes them)."""
    if task not in IMAGE_TASKS and task not in AUDIO_TASKS:
        return value
    if isinstance(value, dict) and task in AUDIO_TASKS and "array" in value:  # {"array": [...], "sampling_rate"}
        return {"array": np.asarray(value["array"], dtype=np.float32), "sampling_rate": value.get("sampling_rate")}
    if not isinstance(value, str):
        raise bad_request(param, value, "send the file's bytes base64-encoded (a string, or a data: URL)")
    data = decode_base64(value, param)
    if task in AUDIO_TASKS:
        return data
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        check_image_size(image, param)  # from the header, before anything is decoded
        image.load()
    except ImageDecodingError as err:
        raise bad_request(param, value, str(err).split(": ", 1)[-1]) from None
    except (UnidentifiedImageError, OSError) as err:
        fix = f"not an image PIL can read ({type(err).__name__}); send PNG or JPEG bytes"
        raise bad_request(param, value, fix) from None
    return image


def decode_base64(value: str, param: str) -> bytes:
    """The bytes of a base64 string or `data:...;base64,` URL; a 400 naming `param` for anything else (a path
    or URL: the server does not read them)."""
    text = value.split(",", 1)[1] if value.startswith("data:") and "," in value else value
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(
            param, value, "not base64; send the file's bytes base64-encoded (the server reads no path or URL)"
        ) from None


def batch_rows(pipe: Any, inputs: int, max_batch_size: int) -> int:
    """The per-device `batch_size` to call the pipeline with for `inputs` inputs: the host batch rounded up to a
    power of two (at most `max_batch_size`), so calls take a few static shapes (one compiled graph each where the
    backend compiles) and at most half a batch of filler rows."""
    rows = min(max_batch_size, 1 << max(0, math.ceil(math.log2(max(1, inputs)))))
    per_call = pipe.host_batch_rows(1)  # devices' rows: device_iterations x replicas
    return max(1, math.ceil(rows / per_call))


def run_pipeline_batch(pipe: Any, jobs: list[Job], max_batch_size: int, param: str = "inputs") -> list[Any]:
    """Run the jobs' inputs as one pipeline call (their settings are the same: one key); one result per job (the
    list of its inputs' results), or an `InputError` for a job whose input the pipeline refused. A batch that
    fails on an input is run again one job at a time, so that only the request that sent it gets the error."""
    items = [item for job in jobs for item in job.items]
    try:
        outputs = pipe(items, batch_size=batch_rows(pipe, len(items), max_batch_size), **jobs[0].kwargs)
    except INPUT_ERRORS as err:
        if len(jobs) > 1:
            return [run_pipeline_batch(pipe, [job], max_batch_size, param)[0] for job in jobs]
        return [refused(pipe, param, jobs[0].kwargs, err)]
    results, start = [], 0
    for job in jobs:
        results.append(outputs[start : start + len(job.items)])
        start += len(job.items)
    return results


def refused(pipe: Any, param: str, kwargs: dict[str, Any], err: BaseException) -> InputError:
    """The 400 of a request the pipeline refused, naming the call argument its message names (`pooling: got 3`,
    "Unrecognized `function_to_apply` argument"), else `param` (the inputs)."""
    message = " ".join(str(err).split())
    named = next((name for name in kwargs if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message)), None)
    if named is None:
        return InputError(param, f"{param}: the {pipe.task} pipeline refused it: {message}")
    if message.startswith(f"{named}:"):
        message = message[len(named) + 1 :].strip()
    return InputError(named, f"{named}: the {pipe.task} pipeline refused it: {message}")


def to_jsonable(value: Any) -> Any:
    """Pipeline outputs as JSON values: numpy and torch scalars and arrays become numbers and lists."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN or infinity
    return value


def warmup_request(pipe: Any) -> tuple[list[Any], dict[str, Any]]:
    """One small input of the task and the arguments it needs, for the request the server answers before it says
    it is healthy (the first call builds buckets, exports or compiles)."""
    task = pipe.task
    text = "Hello, world."
    if task == "question-answering":
        return [{"question": "Who?", "context": text}], {}
    if task == "zero-shot-classification":
        return [text], {"candidate_labels": ["greeting", "farewell"]}
    if task == "fill-mask":
        return [f"Hello, {pipe.tokenizer.mask_token}."], {}
    if task == "text-generation" or task.startswith(("text2text", "summarization", "translation")):
        return [text], {"max_new_tokens": 1}
    if task in IMAGE_TASKS:
        from PIL import Image

        return [Image.new("RGB", (32, 32), (128, 128, 128))], {}
    if task in AUDIO_TASKS:
        rate = int(pipe.feature_extractor.sampling_rate)
        # a generating model (Whisper) may say anything of a second of silence, up to its longest output: 2 tokens
        kwargs = {"max_new_tokens": 2} if task != "audio-classification" and pipe.model.can_generate() else {}
        return [{"array": np.zeros(rate, dtype=np.float32), "sampling_rate": rate}], kwargs
    return [text], {}


def warmup_requests(pipe: Any, max_batch_size: int) -> list[tuple[list[Any], dict[str, Any]]]:
    """The requests the server answers before it says it is healthy: `warmup_request`'s; for text generation whose
    decoding steps compile (`backend="compile"`), one at 1 row and one at 2 (each shape compiles once, 15-30 s for a
    124 M GPT-2 on a 2-core CPU: here, not in a client's request), each decoding a token past its prompt."""
    items, kwargs = warmup_request(pipe)
    if pipe.task != "text-generation" or getattr(getattr(pipe, "runner", None), "backend", None) != "compile":
        return [(items, kwargs)]
    kwargs = {**kwargs, "max_new_tokens": 2}
    return [(items, kwargs)] + ([(items * 2, kwargs)] if max_batch_size > 1 else [])


def api_error_of(result: BaseException) -> APIError:
    """The client's error for a job's exception: 400 for an input the pipeline refused, 500 otherwise."""
    if isinstance(result, APIError):
        return result
    if isinstance(result, InputError):
        return APIError(400, str(result), result.param)
    return APIError(500, f"the pipeline failed: {type(result).__name__}: {result}")
