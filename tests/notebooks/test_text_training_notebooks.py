"""Optimum Graphcore's text training notebooks (fine-tuning with `IPUTrainer`, training from scratch, its
introduction) and its NER and DeBERTa inference notebooks, run cell by cell after the one changed import
(`tests/notebooks/runner.py`): tiny stand-ins under the notebooks' model ids, the shared data in place of the Hub's
data sets, and a few optimizer steps of a few dozen rows (`registry.py` says each stand-in's reason)."""

from __future__ import annotations

import ast
import re


def results(printed: str, key: str) -> list[dict]:
    """The dicts printed whole on one line (the Trainer's logs, `train()`'s and `evaluate()`'s results) that hold
    `key`, their numbers as numbers."""
    found = []
    for match in re.finditer(r"\{[^{}\n]*\}", printed):
        text = re.sub(r"np\.(?:float|int)64\(([^)]*)\)", r"\1", match.group())
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, dict) and key in value:
            found.append({k: float(v) if isinstance(v, str) else v for k, v in value.items()})
    return found


def trained_steps(printed: str) -> int:
    (steps,) = re.findall(r"TrainOutput\(global_step=(\d+), training_loss=[0-9.]+", printed)[-1:]
    return int(steps)


def test_text_classification(run_notebook):
    summary, printed = run_notebook("text_classification.ipynb")
    assert summary["not_applicable"] == 1, summary  # notebook_login
    assert trained_steps(printed) == 2
    assert results(printed, "train_loss")
    metrics = results(printed, "eval_accuracy")[-1]  # trainer.evaluate(): 32 SST-2 rows
    assert (metrics["eval_accuracy"] * 32).is_integer() and metrics["eval_loss"] > 0


def test_token_classification(run_notebook):
    summary, printed = run_notebook("token_classification.ipynb")
    assert trained_steps(printed) == 2, printed[-2000:]
    evaluated = results(printed, "eval_f1")[-1]  # seqeval's scores, through compute_metrics
    assert {"eval_precision", "eval_recall", "eval_accuracy"} <= evaluated.keys()
    report = results(printed, "overall_f1")[-1]  # the last cell: seqeval on trainer.predict()'s tags
    assert 0.0 <= report["overall_accuracy"] <= 1.0


def test_question_answering(run_notebook):
    summary, printed = run_notebook("question_answering.ipynb")
    assert trained_steps(printed) == 1
    assert "odict_keys(['loss', 'start_logits', 'end_logits'])" in printed
    assert "(torch.Size([4, 128]), torch.Size([4, 128]))" in printed  # an evaluation batch, 128-token features
    assert re.search(r"Post-processing 6 example predictions split into \d+ features\.", printed)
    squad = results(printed, "exact_match")[-1]
    assert 0.0 <= squad["exact_match"] <= squad["f1"] <= 100.0


def test_multiple_choice(run_notebook):
    summary, printed = run_notebook("multiple_choice.ipynb")
    assert "Ground truth: option" in printed
    assert trained_steps(printed) == 1
    metrics = results(printed, "eval_accuracy")[-1]  # 8 of the 10 SWAG rows (batches of 2 x 4, the last dropped)
    assert (metrics["eval_accuracy"] * 8).is_integer()


def test_language_modeling(run_notebook):
    summary, printed = run_notebook("language_modeling.ipynb")
    assert [s for s in re.findall(r"TrainOutput\(global_step=(\d+)", printed)] == ["2", "2"]  # GPT-2, then RoBERTa
    perplexities = [float(p) for p in re.findall(r"Perplexity: ([0-9.]+)", printed)]
    assert len(perplexities) == 2 and all(p > 1 for p in perplexities)


def test_language_modelling_from_scratch(run_notebook):
    summary, printed = run_notebook("language_modelling_from_scratch.ipynb")
    assert re.findall(r"TrainOutput\(global_step=(\d+)", printed) == ["1", "1"]
    perplexities = [float(p) for p in re.findall(r"Perplexity: ([0-9.]+)", printed)]
    assert len(perplexities) == 2 and all(p > 1 for p in perplexities)


def test_introduction_to_optimum_graphcore(run_notebook):
    summary, printed = run_notebook("introduction_to_optimum_graphcore.ipynb")
    assert trained_steps(printed) == 2  # 2 epochs of one step
    assert "Post-processing 6 example predictions split into 6 features." in printed
    squad = results(printed, "exact_match")[-1]
    assert 0.0 <= squad["exact_match"] <= squad["f1"] <= 100.0
    assert "Question: What speed-up can one expect from using sequence packing" in printed
    # a span of the text by the model saved in the run's folder (argmax start and end: empty when a random model's
    # end comes before its start)
    assert re.search(r"^Answer: ", printed, re.MULTILINE)


def test_name_entity_extraction(run_notebook):
    summary, printed = run_notebook("name-entity-extraction.ipynb")
    # the 3 cells that launch a Gradio app and the 3 detaching ones
    assert summary["not_applicable"] == 6, summary
    entities = re.findall(r"'entity': '([A-Z]-[A-Z]+|O)'", printed)
    assert entities, printed[-2000:]  # the first pipeline's tags of the first example (the random model tags words)


def test_deberta_blog_notebook(run_notebook):
    summary, printed = run_notebook("deberta-blog-notebook.ipynb")
    assert summary["ran"] + summary["shell_only"] == summary["cells"], summary  # every cell, poptorch's call left out
    # the MNLI model's probability that the hypothesis is entailed (a float16 tensor: the model in half precision)
    assert re.search(r"tensor\(\[0\.\d+\], dtype=torch\.float16", printed), printed[-2000:]
