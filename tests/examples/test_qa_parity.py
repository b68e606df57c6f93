"""IPUTrainer against plain transformers.Trainer on SQuAD: same data, model and seed give the same EM/F1 and loss."""

from __future__ import annotations

import sys
from functools import partial

import pytest
import transformers

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments

from ..conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples" / "question-answering"))
from utils_qa import (  # noqa: E402
    load_squad_json,
    postprocess_qa_predictions,
    prepare_train_features,
    prepare_validation_features,
    squad_metrics,
)


@pytest.fixture(scope="module")
def squad_features(shared_data, tiny_qa_model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_qa_model_dir)
    path = shared_data / "squad" / "squad-v1.1-dev-articles-00-39.json"
    kwargs = {"tokenizer": tokenizer, "max_seq_length": 128, "doc_stride": 64}
    train_examples = load_squad_json(path, slice(0, 1)).select(range(48))
    eval_examples = load_squad_json(path, slice(34, 35)).select(range(24))
    train = train_examples.map(
        partial(prepare_train_features, **kwargs), batched=True, remove_columns=train_examples.column_names
    )
    features = eval_examples.map(
        partial(prepare_validation_features, **kwargs), batched=True, remove_columns=eval_examples.column_names
    )
    return train, eval_examples, features


def run(trainer_cls, args_cls, tiny_qa_model_dir, squad_features, out, **extra):
    # dataloader_drop_last: IPUTrainer keeps every training batch full (static shapes); the stock Trainer is
    # given the same batches, hence the same number of steps and the same LR schedule.
    train, eval_examples, features = squad_features
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(tiny_qa_model_dir)
    args = args_cls(
        output_dir=str(out),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        num_train_epochs=2,
        learning_rate=3e-3,
        logging_steps=1,
        seed=11,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        dataloader_drop_last=True,
    )
    trainer = trainer_cls(model=model, args=args, train_dataset=train, **extra)
    trainer.train()
    trainer.args.dataloader_drop_last = False  # predict every feature
    predictions = trainer.predict(features.remove_columns(["example_id", "offset_mapping"]))
    answers = postprocess_qa_predictions(eval_examples, features, predictions.predictions)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return squad_metrics(answers, eval_examples), losses


def test_same_em_f1_and_loss_curve_as_transformers_trainer(tmp_path, tiny_qa_model_dir, squad_features):
    ours, our_losses = run(
        IPUTrainer, IPUTrainingArguments, tiny_qa_model_dir, squad_features, tmp_path / "a", ipu_config=IPUConfig()
    )
    stock, stock_losses = run(
        transformers.Trainer, transformers.TrainingArguments, tiny_qa_model_dir, squad_features, tmp_path / "b"
    )
    assert len(our_losses) == len(stock_losses) > 10
    assert our_losses == pytest.approx(stock_losses, abs=1e-4)
    assert our_losses[-1] < our_losses[0]
    assert abs(ours["exact_match"] - stock["exact_match"]) <= 0.5 and abs(ours["f1"] - stock["f1"]) <= 0.5
