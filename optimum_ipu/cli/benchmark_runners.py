"""The runners of `optimum-ipu benchmark --mode train|inference`: ours (`IPUTrainer`, the engine), plain
`transformers` (`Trainer`, `Trainer.predict`) and a plain PyTorch loop, each timing its steps on the same batches;
the architectures (random weights) and FLOPs counts they share. `benchmark.run_benchmark` runs them and reports.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode
from tqdm.auto import tqdm
from transformers import TrainerCallback

from ..config import IPUConfig
from ..models.pipelined import to_pipelined
from ..models.plans import position_offset
from ..packing import PackedDataCollator, check_packing_support
from ..runtime.engine import Engine
from ..trainer import IPUTrainer, IPUTrainingArguments, StepTimer
from .benchmark_packing import (
    FeatureCountingLoss,
    PackingWorkload,
    RowDataset,
)

logger = logging.getLogger(__name__)

# name -> (config factory, task -> model class)
ARCHITECTURES: dict[str, Callable[[], transformers.PretrainedConfig]] = {
    "bert-base-uncased-config": lambda: transformers.BertConfig(),
    "bert-large-uncased-config": lambda: transformers.BertConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    ),
    "gpt2-config": lambda: transformers.GPT2Config(),
    # t5-small's special tokens (transformers 5's T5Config() leaves decoder_start_token_id unset)
    "t5-small-config": lambda: transformers.T5Config(decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
    "tiny-bert-config": lambda: transformers.BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256
    ),
    "tiny-gpt2-config": lambda: transformers.GPT2Config(n_embd=128, n_layer=2, n_head=2, vocab_size=1000),
    "tiny-t5-config": lambda: transformers.T5Config(
        d_model=128, d_ff=256, num_layers=2, num_heads=2, vocab_size=1000, decoder_start_token_id=0, pad_token_id=0
    ),
}
TASKS = {
    "question-answering": "AutoModelForQuestionAnswering",
    "causal-lm": "AutoModelForCausalLM",
    "translation": "AutoModelForSeq2SeqLM",
}
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


def flops_per_sample(model: torch.nn.Module, config: Any, seq_len: int, training: bool) -> float:
    """Model FLOPs of one sample of `seq_len` tokens, counted by `torch.utils.flop_counter.FlopCounterMode` over one
    forward of a batch of one (and, in training, its backward): every matmul, attention included. For BERT-base QA at
    384 tokens that is 70.7 GFLOP forward and 212 with the backward, the `2 x P x s + 4 x L x h x s^2` (x3) of the
    usual formula."""
    device = next(model.parameters()).device
    ids = torch.zeros(1, seq_len, dtype=torch.long, device=device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids
    with FlopCounterMode(display=False) as counter, torch.set_grad_enabled(training):
        outputs = model(**inputs)
        if training:
            floats = [v for v in outputs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
            torch.stack([v.float().sum() for v in floats]).sum().backward()
    if training:
        model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def synthetic_batches(
    task: str, config: Any, batch_size: int, seq_len: int, count: int, mode: str = "train"
) -> list[dict]:
    """Fixed random batches shared by every runner: with labels for training; for inference only what a
    prediction takes (and `decoder_input_ids` for sequence-to-sequence models, which their forward needs)."""
    g = torch.Generator().manual_seed(0)
    vocab = config.vocab_size
    batches = []
    for _ in range(count):
        ids = torch.randint(0, vocab, (batch_size, seq_len), generator=g)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if mode == "inference":
            if task == "translation":
                # teacher-forced decoder inputs: the labels shifted right behind the start token
                start = torch.full((batch_size, 1), config.decoder_start_token_id)
                batch["decoder_input_ids"] = torch.cat([start, ids[:, :-1]], dim=1)
        elif task == "question-answering":
            batch["start_positions"] = torch.randint(0, seq_len, (batch_size,), generator=g)
            batch["end_positions"] = torch.randint(0, seq_len, (batch_size,), generator=g)
        else:
            batch["labels"] = ids.clone()
        batches.append(batch)
    return batches


class _BatchList(torch.utils.data.Dataset):
    """The synthetic batches as rows, so that a `Trainer` rebuilds exactly the same batches."""

    def __init__(self, batches: list[dict]) -> None:
        self.rows = [{k: v[i] for k, v in b.items()} for b in batches for i in range(len(b["input_ids"]))]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]


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


def make_model(name: str, task: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = ARCHITECTURES[name]()
    return getattr(transformers, TASKS[task]).from_config(config)


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
    dataset = batches if isinstance(batches, torch.utils.data.Dataset) else _BatchList(batches)
    with tempfile.TemporaryDirectory() as out:
        args = args_cls(
            output_dir=out,
            per_device_train_batch_size=micro,
            max_steps=len(dataset) // opts["batch_size"],
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            bf16=opts["precision"] == "bf16",
            torch_compile=opts["compile"],
            seed=0,
            dataloader_drop_last=True,
            **(args_extra or {}),
            **({"fp32": True} if opts["precision"] == "fp32" and args_cls is IPUTrainingArguments else {}),
        )
        trainer = cls(model=model, args=args, train_dataset=dataset, callbacks=[timer], **extra)
        trainer.train()
    return timer.durations


def _plain_loop(model: torch.nn.Module, batches: list[dict], opts: dict, bar: tqdm) -> list[float]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).train()
    step_model = torch.compile(model) if opts["compile"] else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)  # as transformers.Trainer defaults
    times = []
    for batch in batches:
        start = time.perf_counter()
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=opts["precision"] == "bf16"):
            loss = step_model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        bar.update(1)
    return times


def _synchronize() -> None:
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
    outputs, times = [], []
    for batch in batches:
        start = time.perf_counter()
        outputs.append(engine.eval_step(batch))
        _synchronize()
        times.append(time.perf_counter() - start)
        bar.update(1)
    return times


def _predict_run(model: torch.nn.Module, batches: list[dict], opts: dict, bar: tqdm) -> list[float]:
    """`transformers.Trainer.predict` on the same batches (rebuilt by its loader from rows)."""
    timer = _PredictTimer(bar)
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out,
            per_device_eval_batch_size=opts["batch_size"],
            report_to=[],
            disable_tqdm=True,
            bf16=opts["precision"] == "bf16",
            torch_compile=opts["compile"],
            seed=0,
            dataloader_drop_last=True,
            dataloader_pin_memory=torch.cuda.is_available(),  # on a CPU there is nothing to pin for: it only warns
        )
        trainer = transformers.Trainer(model=model.eval(), args=args, callbacks=[timer])
        timer.start()
        trainer.predict(_BatchList(batches))
    return timer.durations


def _plain_inference_loop(model: torch.nn.Module, batches: list[dict], opts: dict, bar: tqdm) -> list[float]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    step_model = torch.compile(model) if opts["compile"] else model
    outputs, times = [], []
    with torch.no_grad():
        for batch in batches:
            start = time.perf_counter()
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=opts["precision"] == "bf16"):
                outputs.append(step_model(**batch))
            _synchronize()
            times.append(time.perf_counter() - start)
            bar.update(1)
    return times


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
