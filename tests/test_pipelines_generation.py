"""`optimum_ipu.pipelines` generation tasks: text-generation equals `transformers`' pipeline, and summarization,
translation and text-to-text generation equal decoding the stock model's `generate()`, in static batches."""

from __future__ import annotations

import pytest
import transformers

from optimum_ipu import IPUConfig
from optimum_ipu.pipelines import pipeline

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "In 1889 the tower",
    "the movie was",
    "Berlin and Paris are two cities that",
    "A",
    "We went to the river bank and saw",
]
CONFIG = IPUConfig(layers_per_ipu=[1, -1], inference_device_iterations=2)  # host batches of 2 x 2 = 4 rows


def _load(auto_class: str, path):
    return getattr(transformers, auto_class).from_pretrained(path).eval(), transformers.AutoTokenizer.from_pretrained(
        path
    )


def test_text_generation_equals_transformers(tiny_pretrained):
    model, tokenizer = _load("AutoModelForCausalLM", tiny_pretrained("GPT2LMHeadModel"))
    theirs = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    default = pipeline("text-generation", model=model, tokenizer=tokenizer)
    assert default.max_seq_length == 64 and default.host_batch_rows() == 1  # half of the 128 positions: the prompt
    ours = pipeline(
        "text-generation", model=model, tokenizer=tokenizer, ipu_config=CONFIG, batch_size=2, max_seq_length=16
    )
    assert ours.host_batch_rows() == 4
    greedy = {"do_sample": False, "max_new_tokens": 6}
    batched = ours(PROMPTS, **greedy)
    assert batched == [theirs(p, **greedy) for p in PROMPTS]
    assert [ours(p, **greedy) for p in PROMPTS[:3]] == batched[:3]  # one at a time: host batches of 3 filler rows
    assert ours(PROMPTS[:3], return_full_text=False, **greedy) == theirs(PROMPTS[:3], return_full_text=False, **greedy)
    beams = {"do_sample": False, "max_new_tokens": 4, "num_beams": 2, "num_return_sequences": 2}
    assert ours(PROMPTS[:5], **beams) == [theirs(p, **beams) for p in PROMPTS[:5]]
    with pytest.raises(
        ValueError, match="16 prompt tokens . max_new_tokens=256 is more than the model's 128 positions"
    ):
        ours(PROMPTS[0], do_sample=False)  # transformers' default of 256 new tokens does not fit
    with pytest.raises(ValueError, match="give max_new_tokens"):
        ours(PROMPTS[0], do_sample=False, max_new_tokens=None, max_length=20)


@pytest.fixture(scope="module")
def t5(tiny_pretrained):
    model, tokenizer = _load("AutoModelForSeq2SeqLM", tiny_pretrained("T5ForConditionalGeneration"))
    # As T5's own config: a prefix and generation defaults per task (v4 pipelines applied them)
    model.config.task_specific_params = {
        "summarization": {"prefix": "summarize: ", "num_beams": 2, "max_length": 12, "early_stopping": True},
        "translation_en_to_ro": {"prefix": "translate English to Romanian: ", "max_length": 9},
    }
    return model, tokenizer


def _stock(model, tokenizer, texts, tokenizer_kwargs=None, **generate_kwargs):
    """What the stock model generates for each text alone, decoded."""
    out = []
    for text in texts:
        ids = model.generate(**tokenizer(text, return_tensors="pt", **(tokenizer_kwargs or {})), **generate_kwargs)
        out.append(tokenizer.decode(ids[0], skip_special_tokens=True))
    return out


def test_summarization_and_translation_equal_stock_generate(t5):
    model, tokenizer = t5
    assert pipeline("summarization", model=model, tokenizer=tokenizer).max_seq_length == 128  # T5: no position table
    summarizer = pipeline(
        "summarization", model=model, tokenizer=tokenizer, ipu_config=CONFIG, batch_size=2, max_seq_length=24
    )
    summaries = summarizer(PROMPTS)
    expected = _stock(model, tokenizer, ["summarize: " + p for p in PROMPTS], num_beams=2, max_length=12)
    assert summaries == [{"summary_text": text} for text in expected]
    assert [summarizer(p)[0] for p in PROMPTS[:3]] == summaries[:3]  # one at a time: a list of one result, as v4
    # the call's own arguments rank above the task's defaults
    assert summarizer(PROMPTS[:2], num_beams=1, max_new_tokens=3) == [
        {"summary_text": t}
        for t in _stock(model, tokenizer, ["summarize: " + p for p in PROMPTS[:2]], max_new_tokens=3)
    ]

    translator = pipeline(
        "translation_en_to_ro", model=model, tokenizer=tokenizer, ipu_config=CONFIG, max_seq_length=32
    )
    expected = _stock(model, tokenizer, ["translate English to Romanian: " + p for p in PROMPTS], max_length=9)
    assert translator(PROMPTS) == [{"translation_text": text} for text in expected]
    with pytest.raises(ValueError, match="tgt_lang='de'.*pass tgt_lang to pipeline"):
        translator(PROMPTS[0], tgt_lang="de")
    with pytest.raises(ValueError, match="max_seq_length=32"):
        translator("word " * 200)
    long = "translate English to Romanian: " + "word " * 200
    cut = {"truncation": True, "max_length": 32}
    assert translator("word " * 200, truncation=True) == [
        {"translation_text": _stock(model, tokenizer, [long], tokenizer_kwargs=cut, max_length=9)[0]}
    ]


def test_text2text_generation_returns_v4_outputs(t5):
    model, tokenizer = t5
    generator = pipeline("text2text-generation", model=model, tokenizer=tokenizer, max_new_tokens=5, num_beams=2)
    expected = _stock(model, tokenizer, PROMPTS[:3], max_new_tokens=5, num_beams=2)
    assert generator(PROMPTS[:3]) == [{"generated_text": text} for text in expected]
    ids = generator(PROMPTS[0], return_tensors=True)[0]["generated_token_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == expected[0]
    assert generator(PROMPTS[0], prefix="question: ") == [
        {"generated_text": _stock(model, tokenizer, ["question: " + PROMPTS[0]], max_new_tokens=5, num_beams=2)[0]}
    ]


def test_on_a_cpu_prompts_are_padded_to_their_bucket_not_max_seq_length(tiny_pretrained, monkeypatch):
    """Eager on a CPU, a batch of short prompts is padded to the smallest default bucket that holds its longest (16
    tokens here), not to `max_seq_length` (64): the prefill computes no padding, and the answers are transformers'."""
    from optimum_ipu.pipelines import generation

    model, tokenizer = _load("AutoModelForCausalLM", tiny_pretrained("GPT2LMHeadModel"))
    theirs = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    ours = pipeline("text-generation", model=model, tokenizer=tokenizer, batch_size=4)
    lengths = []
    real = generation.generate_static

    def spy(*args, **kwargs):
        lengths.append(kwargs["prompt_length"])
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "generate_static", spy)
    greedy = {"do_sample": False, "max_new_tokens": 5}
    assert ours(PROMPTS[:4], **greedy) == [theirs(p, **greedy) for p in PROMPTS[:4]]
    assert ours.max_seq_length == 64 and lengths == [16]
    long_prompt = " ".join(PROMPTS[:3])  # over 16 tokens: a longer bucket, still below 64
    tokens = len(tokenizer(long_prompt).input_ids)
    want = next(bucket for bucket in (16, 32, 48, 64) if tokens <= bucket)
    assert 16 < tokens < 48
    assert ours(long_prompt, **greedy) == theirs(long_prompt, **greedy)
    assert lengths[-1] == want


def test_max_input_length_is_optimum_graphcores_input_budget(t5):
    """`pipeline(..., max_input_length=N)` (Optimum Graphcore's Flan-T5 notebook): inputs padded to N and longer
    ones cut to it; a call's own `max_input_length` cuts that call's inputs, within the pipeline's."""
    model, tokenizer = t5
    long = "word " * 200
    cut = {"truncation": True, "max_length": 16}
    generator = pipeline(
        "text2text-generation", model=model, tokenizer=tokenizer, max_input_length=16, max_new_tokens=4
    )
    assert generator.max_seq_length == 16
    assert generator(long) == [{"generated_text": _stock(model, tokenizer, [long], cut, max_new_tokens=4)[0]}]
    plain = pipeline("text2text-generation", model=model, tokenizer=tokenizer, max_new_tokens=4)
    assert plain(long, max_input_length=16) == generator(long)  # the call's own cut
    with pytest.raises(ValueError, match=r"max_input_length: got 500; .* at most the pipeline's 128 tokens"):
        plain(long, max_input_length=500)
    with pytest.raises(ValueError, match="both name the input token budget"):
        pipeline("text2text-generation", model=model, tokenizer=tokenizer, max_input_length=16, max_seq_length=32)


@pytest.mark.parametrize("config_id", ["Graphcore/t5-large-ipu", "Graphcore/t5-xl-ipu"])
def test_flan_t5_notebook_runs_on_a_stand_in(tmp_path, shared_data, config_id):
    """Optimum Graphcore's `flan_t5_inference` notebook, its import changed, on a stand-in of Flan-T5's depth (24 + 24
    layers, tiny widths, built here: no download): its IPU config id (4 IPUs: large, 16: xl) and max_input_length."""
    from optimum_ipu import (
        IPUConfig as OGIPUConfig,  # the notebook: `from optimum.graphcore import pipeline, IPUConfig`
    )
    from optimum_ipu import pipeline as og_pipeline

    from .local_tokenizers import t5_unigram

    tokenizer = t5_unigram(shared_data)
    config = transformers.T5Config(
        vocab_size=len(tokenizer), d_model=16, d_kv=4, d_ff=32, num_layers=24, num_heads=4, decoder_start_token_id=0,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    transformers.T5ForConditionalGeneration(config).save_pretrained(tmp_path / "flan-t5")
    tokenizer.save_pretrained(tmp_path / "flan-t5")
    flan_t5 = og_pipeline(
        "text2text-generation",
        model=str(tmp_path / "flan-t5"),
        ipu_config=OGIPUConfig.from_pretrained(config_id, executable_cache_dir=str(tmp_path / "exe_cache")),
        max_input_length=896,
    )
    questions = ["Solve the following equation for x: x^2 - 9 = 0", "At what temperature does nitrogen freeze?"]
    outputs = list(flan_t5(questions, max_new_tokens=3))
    assert len(outputs) == 2 and all(isinstance(o["generated_text"], str) for o in outputs)
    assert flan_t5.max_seq_length == 896 and flan_t5.pipelined.stage_layout(inference=True)
