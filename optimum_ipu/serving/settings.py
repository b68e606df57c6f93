"""What `optimum-ipu serve` is told: the model, its task and IPU config, where to listen, and the server's limits."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# pipeline()'s backends (runtime.inference.runner.BACKENDS; not imported: it would load torch here)
BACKENDS = ("auto", "eager", "compile", "onnxruntime")
# what joins generation rows with --continuous-batching (`serving/app.py` `continuous_engine`)
CONTINUOUS_ENGINES = ("auto", "transformers", "optimum-ipu")


@dataclass
class ServeSettings:
    """The settings of one server, one model held whole in this process.

    Args:
        model (`str`): a model folder or a Hub id (read from the local cache offline).
        task (`str`, *optional*): a `pipeline()` task; inferred from the model as `pipeline()` infers it.
        ipu_config (`str`, *optional*): a folder, JSON file or bundled id of an IPU config; its inference layout
            (`inference_*` values) runs the model, as `pipeline(..., ipu_config=...)` takes it.
        host (`str`, *optional*, defaults to `"127.0.0.1"`): the address to listen on (`0.0.0.0`: every interface).
        port (`int`, *optional*, defaults to 8000): the TCP port (0: any free port).
        max_batch_size (`int`, *optional*): inputs handed to the pipeline in one call at most; by default 8, and 1
            for speech recognition on a CPU (`default_max_batch_size`).
        batch_wait_ms (`float`, *optional*, defaults to 5): how long a batch stays open for more requests at most, once
            its first has arrived, and never more than a tenth of the previous batch's compute time (while the model
            is busy, requests gather anyway).
        max_queue (`int`, *optional*, defaults to 64): requests waiting for a batch at most; past it, 429.
        request_timeout (`float`, *optional*, defaults to 60): seconds a request may take, queue included; past it,
            504.
        max_body_bytes (`int`, *optional*, defaults to 25 MiB): the largest request body; past it, 413.
        served_model_name (`str`, *optional*): the name clients give as `model` (default: the model argument).
        stage_timeout (`float`, *optional*, defaults to 300): under `torchrun`, the seconds a call waits for another
            stage process (a stopped or hung one, which `torchrun` does not notice) before it fails: the request gets
            a 500, `/health` a 503, and the server exits with code 1. A quarter of it (at most 30 s) is the processes'
            heartbeat interval: a stage stopped while the server is idle is noticed 2.5 beats later.
        continuous_batching (`bool`, *optional*, defaults to `False`): generation requests of one choice without a
            seed, greedy or sampled, join the running batch at the next step (`transformers`' continuous batching
            managers, a model whole in this process; `serving/continuous.py`); the others are batched statically.
        continuous_batching_engine (`str`, *optional*, defaults to `"auto"`): what joins the rows: `"transformers"`
            (its managers; a model whole in this process), `"optimum-ipu"` (this project's decoding,
            `serving/joined.py`: one process, or a model split over the processes of a `torchrun` job); `"auto"`:
            `transformers` in one process, `optimum-ipu` under `torchrun`.
        batches_in_flight (`int`, *optional*, defaults to 2): under `torchrun`, with a text-generation model's stages on
            the processes: generation batches (without a seed) that decode at once, their groups taking turns on the
            stages; a batch that arrives while another decodes starts at the stages' next turns instead of waiting for
            its end. 1: one batch at a time. In one process, one batch at a time (`continuous_batching` there).
        backend (`str`, *optional*, defaults to `"auto"`): what runs the model, as `pipeline(..., backend=...)`:
            `"eager"`, `"compile"` (for text generation: its decoding steps through `torch.compile`, compiled during
            the warm-up) or `"onnxruntime"`; `"auto"` picks per device and task.
        generate_kwargs (`dict`, *optional*): for speech recognition, the `generate()` arguments every transcription
            starts from, as `pipeline(..., generate_kwargs=...)` takes them (OpenAI's transcription requests have no
            field for them): e.g. `{"num_beams": 1}` for greedy decoding where the pipeline's default is Whisper's 5
            beams. Other tasks take their generation arguments per request (`/v1/completions`, `/v1/pipeline/<task>`).
    """

    model: str
    task: str | None = None
    ipu_config: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch_size: int | None = None
    batch_wait_ms: float = 5.0
    max_queue: int = 64
    request_timeout: float = 60.0
    max_body_bytes: int = 25 * 1024 * 1024
    served_model_name: str | None = None
    stage_timeout: float = 300.0
    continuous_batching: bool = False
    continuous_batching_engine: str = "auto"
    batches_in_flight: int = 2
    backend: str = "auto"
    generate_kwargs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.generate_kwargs is not None and (
            not isinstance(self.generate_kwargs, dict) or not all(isinstance(k, str) for k in self.generate_kwargs)
        ):
            raise ValueError(
                f"generate_kwargs: got {self.generate_kwargs!r}; give a JSON object of generate() arguments, "
                'e.g. {"num_beams": 1}'
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: got {self.backend!r}; give one of {', '.join(BACKENDS)}")
        if self.continuous_batching_engine not in CONTINUOUS_ENGINES:
            raise ValueError(
                f"continuous_batching_engine: got {self.continuous_batching_engine!r}; give one of "
                f"{', '.join(CONTINUOUS_ENGINES)}"
            )
        if self.continuous_batching_engine != "auto" and not self.continuous_batching:
            raise ValueError(
                f"continuous_batching_engine: got {self.continuous_batching_engine!r} without continuous batching; "
                "add --continuous-batching, or leave the engine out"
            )
        for name, low in (
            *((("max_batch_size", 1),) if self.max_batch_size is not None else ()),
            ("max_queue", 1),
            ("max_body_bytes", 1),
            ("port", 0),
            ("batches_in_flight", 1),
        ):
            _check_number(name, getattr(self, name), low, integer=True)
        for name in ("batch_wait_ms", "request_timeout", "stage_timeout"):
            _check_number(name, getattr(self, name), 0, integer=False)
        for name in ("request_timeout", "stage_timeout"):
            if getattr(self, name) == 0:
                raise ValueError(f"{name}: got 0; give a number of seconds > 0")
        if self.port > 65535:
            raise ValueError(f"port: got {self.port}; give a TCP port from 0 to 65535")

    @property
    def model_name(self) -> str:
        """The name of the served model: `served_model_name`, else the model argument (a folder's own name)."""
        if self.served_model_name:
            return self.served_model_name
        path = os.path.normpath(self.model)
        return os.path.basename(path) if os.path.isdir(path) else self.model


DEFAULT_MAX_BATCH_SIZE = 8
SPEECH_TASK = "automatic-speech-recognition"  # (named here, without torch, for the server and the benchmarks)


def default_max_batch_size(task: str, device_type: str) -> int:
    """`max_batch_size` when it is not given: 8, and 1 for speech recognition on a CPU. There the encoder is most of
    a transcription and its cost grows with its rows (the CPU's arithmetic is the bound), so a batch gains nothing and
    every request in it waits for the slowest: Whisper tiny.en, jfk.flac and 7 FSDD clips in one call took 3.50 s
    against 3.15 s one at a time, and at 32 requests in flight a server batching them had twice the p50 of one
    answering one at a time (BENCHMARKS.md, "Transcriptions against transformers serve")."""
    return 1 if task == SPEECH_TASK and device_type == "cpu" else DEFAULT_MAX_BATCH_SIZE


def _check_number(name: str, value: Any, low: float, integer: bool) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < low:
        what = "an integer" if integer else "a number"
        raise ValueError(f"{name}: got {value!r}; give {what} >= {low}")
