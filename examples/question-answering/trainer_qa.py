"""`IPUTrainer` for extractive question answering: evaluation maps logits back to answer texts first.

The same shape as the `QuestionAnsweringTrainer` of the `transformers` examples, on top of `IPUTrainer`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from transformers.trainer_utils import PredictionOutput, speed_metrics

from optimum_ipu import IPUTrainer


class IPUQuestionAnsweringTrainer(IPUTrainer):
    """`IPUTrainer` whose `evaluate` / `predict` post-process start/end logits into answers before the metric.

    Args:
        eval_examples: the evaluation examples (with `id`, `context`, `answers`), beside the tokenized features.
        post_process_function (`Callable`): `(examples, features, predictions) -> {id: answer text}`.
        kwargs: everything `IPUTrainer` takes; `compute_metrics` receives `(predictions, examples)`.
    """

    def __init__(
        self, *args: Any, eval_examples: Any = None, post_process_function: Callable | None = None, **kwargs: Any
    ) -> None:
        self.qa_metrics = kwargs.pop("compute_metrics", None)
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.post_process_function = post_process_function

    def _run(self, dataset: Any, prefix: str, description: str) -> PredictionOutput:
        start = time.time()
        output = self.evaluation_loop(
            self.get_eval_dataloader(dataset) if prefix == "eval" else self.get_test_dataloader(dataset),
            description=description,
            prediction_loss_only=False,
            metric_key_prefix=prefix,
        )
        steps = math.ceil(output.num_samples / (self.args.eval_batch_size * self.args.world_size))
        output.metrics.update(speed_metrics(prefix, start, num_samples=output.num_samples, num_steps=steps))
        return output

    def evaluate(
        self,
        eval_dataset: Any = None,
        eval_examples: Any = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> dict[str, float]:
        """Run the evaluation features, post-process into answers, and score them (`eval_exact_match`, `eval_f1`)."""
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        examples = self.eval_examples if eval_examples is None else eval_examples
        output = self._run(dataset, metric_key_prefix, "Evaluation")
        metrics = dict(output.metrics)
        if self.post_process_function is not None and self.qa_metrics is not None:
            answers = self.post_process_function(examples, dataset, output.predictions, prefix=metric_key_prefix)
            scores = self.qa_metrics(answers, examples)
            metrics.update({f"{metric_key_prefix}_{k}": v for k, v in scores.items()})
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(
        self,
        predict_dataset: Any,
        predict_examples: Any,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "test",
    ) -> PredictionOutput:
        """Predict answers for `predict_examples`; scored when they carry answers."""
        output = self._run(predict_dataset, metric_key_prefix, "Prediction")
        if self.post_process_function is None:
            return output
        answers = self.post_process_function(predict_examples, predict_dataset, output.predictions, prefix="predict")
        metrics = dict(output.metrics)
        if self.qa_metrics is not None and "answers" in predict_examples.column_names:
            scores = self.qa_metrics(answers, predict_examples)
            metrics.update({f"{metric_key_prefix}_{k}": v for k, v in scores.items()})
        return PredictionOutput(predictions=answers, label_ids=None, metrics=metrics)
