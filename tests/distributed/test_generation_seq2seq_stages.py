"""Serving an encoder-decoder model across stages: `generate()` (greedy, beam search, sampling with a seed) of a T5, a
BART and the pretrained Whisper tiny.en whose stages run on separate processes, each loaded stage-local under
torchrun, gives the tokens of the stock model in one process. The encoder runs once through the stages holding its
layers, its output is broadcast, and each process's KV cache holds keys and values for its own decoder layers only."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from optimum_ipu.pipelines.audio import load_audio

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch
from ..tiny_models import VOCAB, tiny_config
from .seq2seq_generation_worker import CASES, SEED

WORKER = str(REPO_ROOT / "tests" / "distributed" / "seq2seq_generation_worker.py")


def tiny_seq2seq(folder, family: str) -> transformers.PreTrainedModel:
    """A tiny random T5 or BART whose tokens vary from step to step (the default init repeats one token)."""
    config = tiny_config(family)
    config.update({"initializer_factor": 4.0} if family == "t5" else {"init_std": 0.3})
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(config).eval()
    model.save_pretrained(folder)
    return model


def text_inputs() -> dict[str, torch.Tensor]:
    """Two sources of 7 and 5 tokens, right-padded (as an encoder reads them)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB - 1, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    ids[1, 5:], mask[1, 5:] = 1, 0
    return {"input_ids": ids, "attention_mask": mask}


def run_stages(out, model_dir, layout: list[int], inputs: dict[str, torch.Tensor], *flags: str) -> list[dict]:
    """The worker on one process per stage (2 replicas of them with `--fsdp`); every rank's record."""
    torch.save(inputs, out.parent / "inputs.pt")
    args = [str(out), str(model_dir), json.dumps(layout), str(out.parent / "inputs.pt"), *flags]
    processes = len(layout) * (2 if "--fsdp" in flags else 1)
    run = launch(*TORCHRUN, f"--nproc_per_node={processes}", f"--master_port={free_port()}", WORKER, *args)
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(processes)]


def one_process_tokens(model: transformers.PreTrainedModel, inputs: dict, stages: int) -> dict[str, list]:
    """Each case of the worker, by the stock model's `generate()` in this process, seeded as the worker's last stage."""
    tokens = {}
    for name, kwargs in CASES.items():
        torch.manual_seed(SEED + stages - 1)
        with torch.no_grad():
            output = model.generate(**inputs, return_dict_in_generate=True, cache_implementation="dynamic", **kwargs)
            tokens[name] = output.sequences.tolist()
    return tokens


def decoder_layers_held(layout: list[int], encoder_layers: int) -> list[set[int]]:
    """The decoder layers (numbered within the decoder) each stage holds."""
    starts = [sum(layout[:i]) for i in range(len(layout))]
    spans = [range(start, start + count) for start, count in zip(starts, layout, strict=True)]
    return [{i - encoder_layers for i in span if i >= encoder_layers} for span in spans]


@pytest.mark.parametrize(
    ("family", "layout"),
    [("t5", [1, 3]), ("bart", [2, 1, 1])],
    ids=["t5-2-stages-encoder-end-beside-decoder", "bart-3-stages"],
)
def test_seq2seq_generate_across_stages_gives_one_process_tokens(tmp_path, family, layout):
    model = tiny_seq2seq(tmp_path / "model", family)
    inputs = text_inputs()
    ranks = run_stages(tmp_path / "stages", tmp_path / "model", layout, inputs)
    want = one_process_tokens(model, inputs, len(layout))
    for stage, record in enumerate(ranks):
        assert record["tokens"] == want, stage  # every case, every process: the tokens of one process
    assert want["sample"] != want["greedy"]  # sampling drew other tokens than the argmax
    assert len({t for row in want["greedy"] for t in row[1:]}) > 3, "degenerate outputs would prove little"
    whole = sum(p.numel() for p in model.parameters())
    for own, record in zip(decoder_layers_held(layout, 2), ranks, strict=True):
        assert record["held_parameters"] < 0.85 * whole  # its stage, never the whole model
        for name, per_layer in record["cache"].items():
            # a real layer holds keys and values of every head; another stage's layer, one value a token and row
            biggest = max(max(r["cache"][name]) for r in ranks)
            real = {i for i, size in enumerate(per_layer) if size > biggest / 4}
            assert real == own, name  # keys and values of its own decoder layers only
            assert all(size > 0 for size in per_layer), name  # every layer follows the tokens (generate reads it)


def test_seq2seq_generate_on_stages_sharded_over_replicas_gives_one_process_tokens(tmp_path):
    """T5 on 2 stages x 2 replicas, each stage sharded over its replicas (`--fsdp`): the encoder's call and the
    decoding loop give one process's tokens on every process of both replicas."""
    model = tiny_seq2seq(tmp_path / "model", "t5")
    inputs = text_inputs()
    ranks = run_stages(tmp_path / "stages", tmp_path / "model", [1, 3], inputs, "--fsdp")
    want = one_process_tokens(model, inputs, 2)
    for rank, record in enumerate(ranks):
        assert record["tokens"] == want, rank


def test_pretrained_whisper_generates_across_stages(tmp_path, shared_data):
    """Whisper tiny.en (OpenAI's weights), encoder and decoder on two processes: jfk.flac's tokens as one process's."""
    model_dir = shared_data.parent / "models" / "whisper-tiny.en"
    audio = load_audio(str(shared_data / "fixtures" / "audio" / "jfk.flac"), 16_000)
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(model_dir)
    inputs = {"input_features": extractor(audio, sampling_rate=16_000, return_tensors="pt").input_features}
    ranks = run_stages(tmp_path / "stages", model_dir, [4, 4], inputs)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(model_dir).eval()
    want = one_process_tokens(model, inputs, 2)
    for stage, record in enumerate(ranks):
        assert record["tokens"] == want, stage
    tokenizer = transformers.WhisperTokenizer.from_pretrained(model_dir)
    assert "my fellow americans ask not what" in tokenizer.decode(want["greedy"][0], skip_special_tokens=True).lower()
