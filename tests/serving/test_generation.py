"""`/v1/completions` and `/v1/chat/completions` on a tiny GPT-2, through the official `openai` client: greedy
text equal to `model.generate`, seeded sampling equal to the in-process pipeline, streamed chunks adding up to the
non-streamed text, stop strings, concurrent requests decoding as one batch, and bad requests named."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import torch

from .conftest import assert_error, metric, running_server

PROMPTS = ["The weather today", "Trains run late because"]


@pytest.fixture(scope="module")
def server(generator):
    with running_server(generator, max_batch_size=4, batch_wait_ms=50) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0)


def _generate(pipe, prompt: str, max_new_tokens: int) -> str:
    """The new text of the stock model's greedy `generate()` on the prompt alone."""
    encoded = pipe.tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        ids = pipe.model.generate(
            **encoded, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pipe.tokenizer.pad_token_id
        )
    return pipe.tokenizer.decode(ids[0, encoded["input_ids"].shape[1] :], skip_special_tokens=True)


def test_greedy_completions_equal_generate(client, generator):
    response = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=10, temperature=0)
    assert [c.text for c in response.choices] == [_generate(generator, p, 10) for p in PROMPTS]
    assert [c.index for c in response.choices] == [0, 1]
    assert all(c.finish_reason == "length" for c in response.choices)
    prompt_tokens = sum(len(generator.tokenizer(p)["input_ids"]) for p in PROMPTS)
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (prompt_tokens, 20)
    assert response.model == "tiny" and response.object == "text_completion"


def test_streamed_chunks_add_up_to_the_text(client, server):
    url, _ = server
    full = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    before = metric(url, "optimum_ipu_generated_tokens_total")
    chunks = list(client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0, stream=True))
    assert len(chunks) > 2 and "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert metric(url, "optimum_ipu_generated_tokens_total") == before + 12
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    stream = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert stream[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == chat.choices[0].message.content
    assert stream[-1].choices == [] and stream[-1].usage.completion_tokens == 8 == chat.usage.completion_tokens


def test_chat_equals_the_pipeline(client, generator):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=9, temperature=0)
    expected = generator([messages], max_new_tokens=9, do_sample=False, return_full_text=False)[0]
    assert chat.choices[0].message.content == expected[0]["generated_text"]
    assert chat.choices[0].message.role == "assistant" and chat.object == "chat.completion"


def test_seeded_sampling_equals_the_pipeline_with_that_seed(client, generator):
    settings = {"max_tokens": 6, "temperature": 0.9, "top_p": 0.8, "n": 3, "seed": 11}
    first = client.completions.create(model="tiny", prompt=PROMPTS[1], **settings)
    again = client.completions.create(model="tiny", prompt=PROMPTS[1], **settings)
    texts = [c.text for c in first.choices]
    assert len(texts) == 3 and texts == [c.text for c in again.choices]
    torch.manual_seed(11)
    expected = generator(
        [PROMPTS[1]],
        max_new_tokens=6,
        do_sample=True,
        temperature=0.9,
        top_p=0.8,
        top_k=0,
        num_return_sequences=3,
        return_full_text=False,
    )[0]
    assert texts == [r["generated_text"] for r in expected]


def test_stop_strings_end_the_text_before_them(client, generator):
    text = _generate(generator, PROMPTS[0], 12)
    stop = text[3:5]
    assert stop and text.find(stop) >= 0
    response = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0, stop=[stop])
    choice = response.choices[0]
    assert choice.text == text[: text.find(stop)] and choice.finish_reason == "stop"
    chunks = list(
        client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0, stop=stop, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_concurrent_requests_decode_as_one_batch(server, generator):
    url, _ = server
    calls = metric(url, "optimum_ipu_batch_size_count", task="text-generation")

    async def send_all():
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
            requests = [
                client.completions.create(model="tiny", prompt=p, max_tokens=7, temperature=0)
                for p in [*PROMPTS, "A third prompt", "And a fourth"]
            ]
            return await asyncio.gather(*requests)

    responses = asyncio.run(send_all())
    expected = [_generate(generator, p, 7) for p in [*PROMPTS, "A third prompt", "And a fourth"]]
    assert [r.choices[0].text for r in responses] == expected
    assert metric(url, "optimum_ipu_batch_size_count", task="text-generation") - calls < 4


def test_pipeline_endpoint_of_text_generation(server, generator):
    url, _ = server
    body = {"inputs": PROMPTS, "max_new_tokens": 5, "do_sample": False}
    response = httpx.post(f"{url}/v1/pipeline/text-generation", json=body)
    assert response.json() == generator(PROMPTS, max_new_tokens=5, do_sample=False)


def test_bad_generation_requests_name_the_field(server, client, generator):
    url, _ = server
    post = lambda path, body: httpx.post(f"{url}/v1/{path}", json=body)  # noqa: E731
    chat = [{"role": "user", "content": "hi"}]
    assert_error(post("completions", {"prompt": "x", "n": 2, "temperature": 0}), 400, "n", "greedy")
    assert_error(post("completions", {"prompt": "x", "logprobs": 2}), 400, "logprobs", "not supported")
    assert_error(post("completions", {"prompt": "x", "foo": 1}), 400, "foo", "remove it")
    assert_error(post("completions", {"prompt": [1, 2]}), 400, "prompt", "got [1, 2]", "str or list[str]")
    assert_error(post("completions", {"prompt": "x", "temperature": 3}), 400, "temperature", "got 3")
    assert_error(post("completions", {"prompt": "x", "max_tokens": 100}), 400, "max_tokens", "at most 64")
    assert_error(post("completions", {"prompt": "x", "stop": ""}), 400, "stop", "non-empty")
    assert_error(post("completions", {"prompt": "x", "stop": list("abcde")}), 400, "stop", "up to 4")
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    assert_error(post("chat/completions", {"messages": image}), 400, "messages.0.content", "list[TextContent]")
    assert_error(post("completions", {"max_tokens": 3}), 400, "prompt", "missing")
    assert_error(post("completions", {"prompt": "word " * 100}), 400, "prompt", "tokens", "shorten")
    assert_error(
        post("chat/completions", {"messages": [{"role": "robot", "content": "x"}]}), 400, "messages.0.role", "robot"
    )
    assert_error(post("chat/completions", {"messages": []}), 400, "messages", "got []")
    with pytest.raises(openai.NotFoundError, match="'tiny'"):
        client.completions.create(model="gpt-4", prompt="x")
    template, generator.tokenizer.chat_template = generator.tokenizer.chat_template, None
    try:
        assert_error(post("chat/completions", {"messages": chat}), 400, "messages", "chat template")
    finally:
        generator.tokenizer.chat_template = template
    # a good request still answers after the bad ones
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=0).choices[0].text


def test_more_prompts_than_a_batch_stream_each_to_its_choice(client, generator):
    prompts = [f"Prompt number {i} says" for i in range(6)]  # 6 > --max-batch-size 4: two generate() calls
    expected = [_generate(generator, p, 5) for p in prompts]
    response = client.completions.create(model="tiny", prompt=prompts, max_tokens=5, temperature=0)
    assert [c.text for c in response.choices] == expected
    texts, pieces = [""] * len(prompts), [0] * len(prompts)
    for chunk in client.completions.create(model="tiny", prompt=prompts, max_tokens=5, temperature=0, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            pieces[choice.index] += bool(choice.text)
    assert texts == expected
    assert min(pieces) > 1  # each choice's text came token by token, not all at the end
