"""The runners of `optimum-ipu benchmark --mode train|inference`: ours (`IPUTrainer`, the engine), plain
`transformers` (`Trainer`, `Trainer.predict`) and a plain PyTorch loop, each timing its steps on the same batches
(with `--packing`: ours on packed rows, the baselines on the same features padded). `run.run_benchmark` runs them
and `report` reports.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm
from transformers import TrainerCallback

from ..config import IPUConfig
from ..models.pipelined import to_pipelined
from ..models.plans import position_offset
from ..packing import PackedDataCollator, check_packing_support
from ..runtime.engine import Engine
from ..trainer import IPUTrainer, IPUTrainingArguments, StepTimer
from .architectures import make_model
from .packing import FeatureCountingLoss, PackingWorkload, RowDataset

OURS_PACKED = "optimum-ipu IPUTrainer (packed)"


@dataclass
class RunResult:
    """One runner's measurement."""

    name: str
    samples_per_second: float
    tokens_per_second: float
    time_to_first_step_s: float
    step_times_s: list[float] = field(repr=False)
    peak_memory_gib: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    # --packing: the layout, steps and features of this runner (samples are SQuAD features, tokens real ones)
    packing: dict[str, Any] | None = None


def batch_rows(batches: list[dict]) -> RowDataset:
    """The batches as rows, so that a `Trainer`'s loader rebuilds exactly the same batches."""
    return RowDataset([{k: v[i] for k, v in b.items()} for b in batches for i in range(len(b["input_ids"]))])


class _Timer(StepTimer):
    """`IPUTrainer`'s step timer, waiting for the GPU at each step end and moving the progress bar."""

    def __init__(self, bar: tqdm) -> None:
        super().__init__()
        self.bar = bar

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        super().on_step_end(args, state, control, **kwargs)
        self.bar.update(1)


def _trainer_run(
    cls: type,
    args_cls: type,
    model: torch.nn.Module,
    batches: list[dict] | torch.utils.data.Dataset,
    opts: dict,
    bar: tqdm,
    timer: _Timer | None = None,
    args_extra: dict | None = None,
    **extra: Any,
) -> list[float]:
    """One optimizer step per batch of `batches` (or per `opts["batch_size"]` rows of a dataset: one epoch), in
    `opts["micro_batches"]` micro-batches (ours: the IPU config's accumulation x replicas; 1 for the baselines),
    so that every runner steps on the same samples."""
    timer = timer or _Timer(bar)
    micro = opts["batch_size"] // opts.get("micro_batches", 1)
    dataset = batches if isinstance(batches, torch.utils.data.Dataset) else batch_rows(batches)
    with tempfile.TemporaryDirectory() as out:
        args = args_cls(
            **_common_arguments(out, opts),
            per_device_train_batch_size=micro,
            max_steps=len(dataset) // opts["batch_size"],
            save_strategy="no",
            logging_strategy="no",
            **(args_extra or {}),
            **({"fp32": True} if opts["precision"] == "fp32" and args_cls is IPUTrainingArguments else {}),
        )
        trainer = cls(model=model, args=args, train_dataset=dataset, callbacks=[timer], **extra)
        trainer.train()
    return timer.durations


def _plain_loop(model: torch.nn.Module, batches: list[dict], opts: dict, bar: tqdm) -> list[float]:
    """A plain PyTorch training loop: AdamW (fused, as `transformers.Trainer` defaults), gradients clipped at 1."""
    device, step_model = _on_device(model.train(), opts)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)  # as transformers.Trainer defaults

    def step(batch: dict) -> None:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=opts["precision"] == "bf16"):
            loss = step_model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _timed_steps(batches, bar, step)


def _common_arguments(output_dir: str, opts: dict) -> dict[str, Any]:
    """The `TrainingArguments` of every `Trainer` runner: nothing reported, no progress bar of its own, the
    precision and compilation of `opts`, seed 0, whole batches only."""
    return {
        "output_dir": output_dir,
        "report_to": [],
        "disable_tqdm": True,
        "bf16": opts["precision"] == "bf16",
        "torch_compile": opts["compile"],
        "seed": 0,
        "dataloader_drop_last": True,
    }


def _on_device(model: torch.nn.Module, opts: dict) -> tuple[torch.device, torch.nn.Module]:
    """The GPU if there is one, else the CPU; `model` moved there, and what runs a step (compiled with `opts`)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    return device, torch.compile(model) if opts["compile"] else model


def _timed_steps(batches: list[dict], bar: tqdm, step: Callable[[dict], Any]) -> list[float]:
    """`step` on each batch in turn, each timed to the end of its GPU work; the progress bar moves a step each."""
    times = []
    for batch in batches:
        start = time.perf_counter()
        step(batch)
        _synchronize()
        times.append(time.perf_counter() - start)
        bar.update(1)
    return times


def _synchronize() -> None:
    """Wait for the GPU's queued work, if there is a GPU."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class _PredictTimer(TrainerCallback):
    """Times `Trainer.predict`'s steps: the interval between two prediction steps (the first from the call)."""

    def __init__(self, bar: tqdm) -> None:
        self.bar = bar
        self.durations: list[float] = []
        self._last = 0.0

    def start(self) -> None:
        self._last = time.perf_counter()

    def on_prediction_step(self, args, state, control, **kwargs):
        _synchronize()
        now = time.perf_counter()
        self.durations.append(now - self._last)
        self._last = now
        self.bar.update(1)


def _engine_inference(
    model: torch.nn.Module, batches: list[dict], opts: dict, bar: tqdm, ipu_config: IPUConfig
) -> list[float]:
    """Ours: the pipelined model in its inference layout, one engine host call per batch, as `pipeline()` runs it
    (outputs kept on the device, as `Trainer.predict` keeps them until the end)."""
    config = ipu_config.copy().eval()
    pipelined = to_pipelined(model.eval(), config, parallelize=True)
    engine = Engine(pipelined, config, precision=opts["precision"], compile=opts["compile"])
    outputs = []
    return _timed_steps(batches, bar, lambda batch: outputs.append(engine.eval_step(batch)))


def _predict_run(model: torch.nn.Module, batches: list[dict], opts: dict, bar: tqdm) -> list[float]:
    """`transformers.Trainer.predict` on the same batches (rebuilt by its loader from rows)."""
    timer = _PredictTimer(bar)
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            **_common_arguments(out, opts),
            per_device_eval_batch_size=opts["batch_size"],
            dataloader_pin_memory=torch.cuda.is_available(),  # on a CPU there is nothing to pin for: it only warns
        )
        trainer = transformers.Trainer(model=model.eval(), args=args, callbacks=[timer])
        timer.start()
        trainer.predict(batch_rows(batches))
    return timer.durations


def _plain_inference_loop(model: torch.nn.Module, batches: list[dict], opts: dict, bar: tqdm) -> list[float]:
    """A plain `torch.no_grad()` loop, outputs kept (as `Trainer.predict` keeps them)."""
    device, step_model = _on_device(model.eval(), opts)
    outputs = []

    def step(batch: dict) -> None:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=opts["precision"] == "bf16"):
            outputs.append(step_model(**batch))

    with torch.no_grad():
        return _timed_steps(batches, bar, step)


def micro_batches_per_step(config: IPUConfig) -> int:
    """Micro-batches of one `IPUTrainer` optimizer step in one process: accumulation x replicas (run in turn)."""
    return config.value("gradient_accumulation_steps") * config.value("replication_factor")


def build_runners(
    mode: str, model: str, task: str, batches: list[dict], opts: dict, config: IPUConfig
) -> dict[str, Callable[[tqdm], list[float]]]:
    """Runner name -> a function timing each step; ours first (the ratios are against it)."""
    if mode == "inference":
        return {
            "optimum-ipu engine (inference)": lambda bar: _engine_inference(
                make_model(model, task), batches, opts, bar, config
            ),
            "transformers.Trainer.predict": lambda bar: _predict_run(make_model(model, task), batches, opts, bar),
            "plain torch.no_grad loop": lambda bar: _plain_inference_loop(make_model(model, task), batches, opts, bar),
        }
    ours = {**opts, "micro_batches": micro_batches_per_step(config)}
    return {
        "optimum-ipu IPUTrainer": lambda bar: _trainer_run(
            IPUTrainer, IPUTrainingArguments, make_model(model, task), batches, ours, bar, ipu_config=config
        ),
        "transformers.Trainer": lambda bar: _trainer_run(
            transformers.Trainer, transformers.TrainingArguments, make_model(model, task), batches, opts, bar
        ),
        "plain PyTorch loop": lambda bar: _plain_loop(make_model(model, task), batches, opts, bar),
    }


def _packed_trainer_run(
    model: torch.nn.Module, workload: PackingWorkload, opts: dict, bar: tqdm, config: IPUConfig
) -> tuple[list[float], list[int]]:
    """Ours with `--packing`: `IPUTrainer` on the packed rows, through `PackedDataCollator` and the packed QA loss
    (as `run_qa.py --packing` trains); returns the step times and the features of each step."""
    check_packing_support(model)
    timer = _Timer(bar)
    loss = FeatureCountingLoss(lambda: len(timer.durations))
    collator = PackedDataCollator(
        workload.seq_len, workload.max_features_per_row, model.config.pad_token_id or 0, position_offset(model.config)
    )
    times = _trainer_run(
        IPUTrainer,
        IPUTrainingArguments,
        model,
        RowDataset(workload.packed_rows()),
        opts,
        bar,
        timer=timer,
        args_extra={"label_names": ["labels"]},
        ipu_config=config,
        data_collator=collator,
        compute_loss_func=loss,
    )
    return times, loss.per_step(len(times))


def packing_runners(
    model: str, workload: PackingWorkload, opts: dict, config: IPUConfig
) -> dict[str, Callable[[tqdm], tuple[list[float], list[int]]]]:
    """`--packing`: runner name -> (step times, features per step); ours on packed rows, the baselines on the same
    features padded to `--seq-len`, `--batch-size` features a step."""
    ours = {**opts, "micro_batches": micro_batches_per_step(config)}
    task, batches = "question-answering", workload.padded_batches
    padded = [opts["batch_size"]] * len(batches)
    return {
        OURS_PACKED: lambda bar: _packed_trainer_run(make_model(model, task), workload, ours, bar, config),
        "transformers.Trainer (padded)": lambda bar: (
            _trainer_run(
                transformers.Trainer, transformers.TrainingArguments, make_model(model, task), batches, opts, bar
            ),
            padded,
        ),
        "plain PyTorch loop (padded)": lambda bar: (_plain_loop(make_model(model, task), batches, opts, bar), padded),
    }


def packing_result(
    name: str, times: list[float], features: list[int], warmup: int, workload: PackingWorkload, sample_flops: float
) -> dict[str, Any]:
    """Features per second over the timed steps (after `warmup`): features in them / their time."""
    timed_s, timed_features = sum(times[warmup:]), sum(features[warmup:])
    rate = timed_features / timed_s
    packed = name == OURS_PACKED
    return {
        "samples_per_second": rate,
        "tokens_per_second": rate * workload.mean_length,
        "tflops": rate * sample_flops / 1e12,
        "packing": {
            "layout": "packed rows" if packed else "padded features",
            "steps": len(times),
            "rows_per_step" if packed else "features_per_step": workload.batch_size,
            "features": sum(features),
            "timed_features": timed_features,
            "timed_seconds": timed_s,
            "features_per_second": rate,
            "real_tokens_per_second": rate * workload.mean_length,
        },
    }
