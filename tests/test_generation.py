"""`generate_static`: a padded batch and padded prompts give the tokens of stock `generate()` row by row."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import StaticCache

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.models.generation import cache_keyword, cross_attention_cache, generate_static

from .helpers import PAD, generating_model
from .tiny_models import VOCAB

ROWS, PROMPT, BATCH, PROMPT_LENGTH = 3, 7, 5, 11


def prompts(encoder_decoder: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """A batch of prompts of 7, 5 and 3 tokens, padded on the side the model generates with."""
    g = torch.Generator().manual_seed(3)
    lengths = [PROMPT, PROMPT - 2, PROMPT - 4]
    rows = [torch.randint(2, VOCAB - 1, (n,), generator=g) for n in lengths]
    ids = torch.full((ROWS, PROMPT), PAD)
    mask = torch.zeros((ROWS, PROMPT), dtype=torch.long)
    for r, row in enumerate(rows):
        where = slice(0, len(row)) if encoder_decoder else slice(PROMPT - len(row), PROMPT)
        ids[r, where], mask[r, where] = row, 1
    return ids, mask, rows


@pytest.mark.parametrize("num_beams", [1, 3], ids=["greedy", "beam3"])
@pytest.mark.parametrize("class_name", ["GPT2LMHeadModel", "T5ForConditionalGeneration"])
def test_padded_batch_and_prompts_give_stock_tokens(class_name, num_beams):
    model = generating_model(class_name)
    encoder_decoder = model.config.is_encoder_decoder
    ids, mask, rows = prompts(encoder_decoder)
    kwargs = {"max_new_tokens": 9, "num_beams": num_beams, "do_sample": False}
    out = generate_static(model, ids, mask, batch_size=BATCH, prompt_length=PROMPT_LENGTH, **kwargs)
    assert out.shape[0] == ROWS
    # the static prompt is part of a decoder-only model's output; T5's output starts with the decoder start token
    new_tokens = out if encoder_decoder else out[:, PROMPT_LENGTH:]
    distinct = set()
    for r, row in enumerate(rows):
        with torch.no_grad():
            reference = model.generate(input_ids=row[None], pad_token_id=PAD, **kwargs)[0]
        reference = reference if encoder_decoder else reference[len(row) :]
        got = new_tokens[r]
        assert got[: len(reference)].tolist() == reference.tolist(), (r, got.tolist(), reference.tolist())
        assert (got[len(reference) :] == PAD).all()  # a row that ended early is padded, as generate() pads it
        distinct.update(reference.tolist())
    assert len(distinct) > 4, "the outputs are degenerate: the comparison would prove little"


def test_the_kv_cache_is_static_at_full_length():
    model = generating_model("T5ForConditionalGeneration")
    ids, mask, _ = prompts(encoder_decoder=True)
    out = generate_static(
        model,
        ids,
        mask,
        batch_size=BATCH,
        prompt_length=PROMPT_LENGTH,
        max_new_tokens=6,
        return_dict_in_generate=True,
    )
    cache = out.cache
    assert isinstance(cache.self_attention_cache, StaticCache)
    assert isinstance(cache.cross_attention_cache, StaticCache)
    # (batch, heads, positions, head size): the padded batch; the full prompt and the full output length
    assert cache.cross_attention_cache.layers[0].keys.shape[::2] == (BATCH, PROMPT_LENGTH)
    assert cache.self_attention_cache.layers[0].keys.shape[::2] == (BATCH, 6)
    assert out.sequences.shape[0] == ROWS


def test_a_pipelined_model_generates_through_its_stock_model():
    model = generating_model("T5ForConditionalGeneration")
    ids, mask, _ = prompts(encoder_decoder=True)
    pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=[-1, -1], ipus_per_replica=2)).parallelize()
    torch.testing.assert_close(
        generate_static(pipelined, ids, mask, batch_size=4, max_new_tokens=5),
        generate_static(model, ids, mask, max_new_tokens=5),
    )


@pytest.mark.parametrize("class_name", ["GPT2LMHeadModel", "T5ForConditionalGeneration"])
def test_pipelined_generate_gives_the_stock_tokens(class_name):
    """`pipelined.generate(...)`, as code written for Optimum Graphcore calls it, is the stock `generate()`."""
    model = generating_model(class_name)
    ids, mask, rows = prompts(model.config.is_encoder_decoder)
    pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=[-1, -1], ipus_per_replica=2), parallelize=True).eval()
    got = pipelined.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    for r, row in enumerate(rows):
        stock = model.generate(row[None], max_new_tokens=6, do_sample=False)[0]
        generated = got[r, -len(stock) :] if model.config.is_encoder_decoder else got[r, PROMPT - len(row) :]
        assert generated.tolist()[: len(stock)] == stock.tolist(), (class_name, r)
    with pytest.raises(ValueError, match="give the prompts as `input_ids`"):
        pipelined.generate(max_new_tokens=2)


def test_bad_sizes_are_clear_errors():
    model = generating_model("T5ForConditionalGeneration")
    ids, mask, _ = prompts(encoder_decoder=True)
    with pytest.raises(ValueError, match="a prompt has 7 tokens but prompt_length is 5: raise prompt_length"):
        generate_static(model, ids, mask, prompt_length=5, max_new_tokens=2)
    with pytest.raises(ValueError, match="a batch of 3 prompts is larger than batch_size 2"):
        generate_static(model, ids, mask, batch_size=2, max_new_tokens=2)


@pytest.mark.parametrize("inputs", [1, 3], ids=["one-input", "three-inputs"])
def test_cross_attention_cache_gives_the_stock_beams(inputs):
    """The cross-attention keys and values computed once per input (views for the beams of one input, copies for
    several) give stock beam search's tokens."""
    model = generating_model("T5ForConditionalGeneration")
    ids, mask, _ = prompts(encoder_decoder=True)
    ids, mask = ids[:inputs], mask[:inputs]
    knobs = dict(attention_mask=mask, max_new_tokens=6, num_beams=3, do_sample=False)
    with torch.no_grad():
        stock = model.generate(input_ids=ids, **knobs)
        encoded = model.get_encoder()(input_ids=ids, attention_mask=mask)
        cache = cross_attention_cache(model, encoded, beams=3)
        keys = cache.cross_attention_cache.layers[0].keys
        assert keys.shape[0] == 3 * inputs and (keys.stride(0) == 0) == (inputs == 1)
        shared = model.generate(encoder_outputs=encoded, **{cache_keyword(model): cache}, **knobs)
    assert shared.tolist() == stock.tolist()
