"""pipeline() without a task (inferred from the model, as transformers.pipeline does), without a model (Optimum
Graphcore's default checkpoint; offline, one line naming it), and text generation by sampling with a seed (the
tokens of transformers' pipeline and generate())."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import huggingface_hub
import pytest
import transformers
from huggingface_hub import constants

from optimum_ipu.pipelines import (
    SUPPORTED_TASKS,
    TASK_DEFAULTS,
    IPUTextClassificationPipeline,
    IPUTextGenerationPipeline,
    NoDefaultModelOfflineError,
    factory,
    infer_task,
    pipeline,
)

CLASS_TASKS = {
    "BertForSequenceClassification": "text-classification",
    "BertForTokenClassification": "token-classification",
    "BertForQuestionAnswering": "question-answering",
    "BertForMaskedLM": "fill-mask",
    "GPT2LMHeadModel": "text-generation",
    "T5ForConditionalGeneration": "text2text-generation",
}


def test_task_inferred_from_the_config_of_a_folder_or_object(tiny_pretrained):
    for class_name, task in CLASS_TASKS.items():
        assert infer_task(str(tiny_pretrained(class_name)), SUPPORTED_TASKS) == task, class_name
    folder = tiny_pretrained("BertForSequenceClassification")
    inferred = pipeline(model=str(folder), backend="eager")
    named = pipeline("text-classification", model=str(folder), backend="eager")
    assert isinstance(inferred, IPUTextClassificationPipeline) and inferred.task == "text-classification"
    assert inferred(["a fine day", "rain again"]) == named(["a fine day", "rain again"])
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_pretrained("GPT2LMHeadModel"))
    assert isinstance(pipeline(model=model), IPUTextGenerationPipeline)  # an object: its class, its folder's tokenizer


def test_a_config_without_a_class_is_one_clear_error(tiny_pretrained, tmp_path):
    config = json.loads((tiny_pretrained("BertForSequenceClassification") / "config.json").read_text())
    config.pop("architectures")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match="names no class .no 'architectures'., which no supported task takes; pass the task, one of text-c",
    ):
        pipeline(model=str(tmp_path))
    with pytest.raises(ValueError, match="give a task, a model, or both"):
        pipeline()


def test_online_hub_ids_take_the_hubs_pipeline_tag(monkeypatch):
    """As transformers.get_task (mocked Hub: no network here); the tags transformers 5 refuses are taken too."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    tags = {"org/summarizer": "summarization", "org/sentiment": "sentiment-analysis", "org/vision": "depth-estimation"}
    asked = []

    def model_info(model_id, token=None):
        asked.append(model_id)
        return SimpleNamespace(pipeline_tag=tags[model_id], library_name="transformers")

    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    assert infer_task("org/summarizer", SUPPORTED_TASKS) == "summarization"
    assert infer_task("org/sentiment", SUPPORTED_TASKS) == "text-classification"
    with pytest.raises(ValueError, match="the Hub says its task is 'depth-estimation'.*pass a task"):
        infer_task("org/vision", SUPPORTED_TASKS)
    assert asked == list(tags)


def test_no_model_offline_names_the_default_in_one_line():
    assert constants.is_offline_mode()  # the suite runs offline
    with pytest.raises(NoDefaultModelOfflineError) as error:
        pipeline("sentiment-analysis")
    message = str(error.value)
    assert "\n" not in message and isinstance(error.value, ValueError)
    assert "distilbert-base-uncased-finetuned-sst-2-english (revision af0f99b)" in message
    assert "HF_HUB_OFFLINE=1" in message and "pass model=" in message
    with pytest.raises(NoDefaultModelOfflineError, match="t5-small .revision 9507060."):
        pipeline("translation_en_to_fr")


def test_no_model_offline_loads_the_default_the_hub_cache_holds(tiny_pretrained, tmp_path, monkeypatch):
    # transformers reads a cached download offline: so does pipeline(task), for its pinned default
    default = TASK_DEFAULTS["text-classification"]
    repo = tmp_path / f"models--{default.model}"
    (repo / "snapshots").mkdir(parents=True)
    (repo / "snapshots" / default.revision).symlink_to(tiny_pretrained("DistilBertForSequenceClassification"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(default.revision)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    classifier = pipeline("sentiment-analysis")
    assert type(classifier.model).__name__ == "DistilBertForSequenceClassification"
    assert set(classifier(["I love you"])[0]) == {"label", "score"}


@pytest.mark.parametrize("value", ["false", "no", "0", False])
def test_boolean_options_take_booleans_and_their_command_line_strings(value, tiny_pretrained):
    folder = tiny_pretrained("BertForSequenceClassification")
    assert pipeline("text-classification", folder, quantize=value, backend="eager").runner.backend == "eager"
    for wrong in ("maybe", 2, [True]):
        with pytest.raises(ValueError, match=re.escape(f"quantize: got {wrong!r}; expected True or False")):
            pipeline("text-classification", folder, quantize=wrong)


class StopBeforeDownload(Exception):
    pass


def test_no_model_online_loads_the_pinned_default_with_its_ipu_config(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    loads = []

    def load(task, spec, model, ipu_config, tokenizer, model_kwargs):
        loads.append((task, model, ipu_config, model_kwargs))
        raise StopBeforeDownload  # no network here

    monkeypatch.setattr(factory, "_load_model", load)
    for task in ("question-answering", "summarization"):
        with pytest.raises(StopBeforeDownload):
            pipeline(task)
    assert loads == [
        (
            "question-answering",
            "distilbert-base-cased-distilled-squad",
            "Graphcore/distilbert-base-ipu",
            {"revision": "626af31"},
        ),
        ("summarization", "ainize/bart-base-cnn", {"ipus_per_replica": 2}, {"revision": "b90bc9a"}),
    ]
    # every task of Optimum Graphcore's pipeline() has its default; ours (feature-extraction, sentence-embeddings) none
    assert set(TASK_DEFAULTS) == set(SUPPORTED_TASKS) - {"feature-extraction", "sentence-embeddings"}


def test_no_model_online_reads_the_tokenizer_at_the_pinned_revision(monkeypatch, tiny_pretrained):
    """The whole path with the Hub's two reads mocked (the model, its tokenizer): a working pipeline."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    folder = tiny_pretrained("GPT2LMHeadModel")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    reads = []

    def load(task, spec, name, ipu_config, tokenizer, model_kwargs):
        reads.append(("model", name, model_kwargs["revision"]))
        return model, ipu_config, name  # the tokenizer from the model's repository

    def load_processors(path, needed, given, revision=None):
        reads.append(("tokenizer", path, revision))
        return {"tokenizer": transformers.AutoTokenizer.from_pretrained(folder)}

    monkeypatch.setattr(factory, "_load_model", load)
    monkeypatch.setattr(factory, "load_processors", load_processors)
    generator = pipeline("text-generation", max_seq_length=8)
    assert reads == [("model", "gpt2", "e7da7f2"), ("tokenizer", "gpt2", "e7da7f2")]
    assert generator("Once upon", do_sample=False, max_new_tokens=3)[0]["generated_text"].startswith("Once upon")


PROMPTS = ["The capital of France is", "Once upon a time", "A", "We went to the river bank and saw"]


def test_sampling_with_a_seed_gives_transformers_tokens(tiny_pretrained):
    folder = tiny_pretrained("GPT2LMHeadModel")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    theirs = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    ours = pipeline("text-generation", model=model, tokenizer=tokenizer, max_seq_length=16)
    sample = {"do_sample": True, "max_new_tokens": 8, "top_k": 0, "temperature": 1.0}
    by_seed = {}
    for seed in (0, 1, 2):
        transformers.set_seed(seed)
        expected = [theirs(p, **sample)[0]["generated_text"] for p in PROMPTS]
        transformers.set_seed(seed)
        assert [ours(p, **sample)[0]["generated_text"] for p in PROMPTS] == expected, seed
        transformers.set_seed(seed)
        stock = []
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt")
            out = model.generate(**ids, **sample, pad_token_id=tokenizer.eos_token_id)
            stock.append(tokenizer.decode(out[0], skip_special_tokens=True))
        assert stock == expected, seed
        by_seed[seed] = expected
    assert len({tuple(texts) for texts in by_seed.values()}) == 3  # the seed decides: sampling, not greedy
    greedy = [ours(p, do_sample=False, max_new_tokens=8)[0]["generated_text"] for p in PROMPTS]
    assert greedy not in by_seed.values()
