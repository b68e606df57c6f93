"""`"audio-classification"` and `"automatic-speech-recognition"` at static shapes.

`transformers`' own pipelines (`AudioClassificationPipeline`, `AutomaticSpeechRecognitionPipeline`: feature
extraction, chunking with strides, CTC and Whisper decoding, timestamps) with two changes:

- audio is decoded here (`optimum_ipu.pipelines.audio`: `soundfile`, no FFmpeg; resampled with scipy, no
  torchaudio), from a file path, bytes, a `{"array"/"raw", "sampling_rate"}` dict or a 1-D array at the feature
  extractor's rate;
- the model runs in host batches of fixed shapes: raw-waveform models (Wav2Vec2, HuBERT) get every input padded to
  a bucket length (the chunk length when `chunk_length_s` is given, else the next of 1, 2, 4, 8, 16, 32 ... seconds)
  with its attention mask where the feature extractor makes one, and CTC frames past an input's own length are read
  as blanks; Whisper's feature extractor already pads to 30 s, and it generates with `transformers`' static KV cache
  (`cache_implementation="static"`) on accelerators, and its dynamic one on CPUs, where nothing is compiled and the
  static cache's full-length attention costs 13x (jfk.flac, Whisper tiny.en: 46 s against 3.6 s).

Whisper's plain transcription (no timestamps, no language, one decoding per input) takes a speed path with the
tokens of `transformers`' own `_forward` (checked on jfk.flac and 50 FSDD clips): the encoder runs apart, once per
input, in its own precision (`encoder_precision`: bf16 on CPUs with AVX512-BF16 or AMX, where it takes 0.19 s
against 0.30 s in fp32), and `generate()` decodes from its output with the cross-attention keys and values computed
once per input rather than once per beam, and never reordered between beam-search steps
(`optimum_ipu.models.generation.cross_attention_cache`: with 5 beams, 3.5 GFLOP instead of 17.7, and 92 MB not
copied at each step), and the projection onto the vocabulary runs weight-major on CPUs
(`optimum_ipu.runtime.serialization.WeightMajorLinear`: 6.4-8.3 ms a step for 5 beams against 16.6-17.1). Its figures
against `transformers`' pipeline: `optimum-ipu benchmark --mode latency --task automatic-speech-recognition`
(BENCHMARKS.md, "Speech recognition latency").

With an attention mask (feature extractors with `return_attention_mask=True`, models with
`feat_extract_norm="layer"`), padding changes nothing and the outputs are those of `transformers`' pipeline on each
input alone. Checkpoints without one (e.g. `wav2vec2-base`) see the padding, as in `transformers`' own batches.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import AudioClassificationPipeline, AutomaticSpeechRecognitionPipeline
from transformers.modeling_outputs import BaseModelOutput, SequenceClassifierOutput
from transformers.pipelines.automatic_speech_recognition import rescale_stride

from ..models.generation import cache_keyword, cross_attention_cache, speech_cache_implementation
from ..runtime.engine import Engine
from ..runtime.inference.runner import encoder_precision
from ..runtime.serialization import weight_major_projection
from .audio import load_audio, resample
from .base import StaticBatchingPipeline

_BUCKET_KEY = "_bucket_samples"
_LENGTH_KEY = "_samples"


def bucket_samples(samples: int, sampling_rate: int) -> int:
    """The padded length of a waveform of `samples`: the next power of two seconds (at least 1 s)."""
    seconds = max(1.0, samples / sampling_rate)
    return int(sampling_rate * 2 ** math.ceil(math.log2(seconds)))


def _decode(inputs: Any, sampling_rate: int) -> Any:
    """What `transformers`' preprocess takes, decoded without FFmpeg or torchaudio: a 1-D array at `sampling_rate`,
    or a dict of that array with its `stride` (scaled to the new rate) and any other keys."""
    if not isinstance(inputs, dict):
        return load_audio(inputs, sampling_rate)
    inputs = dict(inputs)
    array = inputs.pop("raw", None)
    array = inputs.pop("array", None) if array is None else array
    if array is None:
        return load_audio(inputs, sampling_rate)  # a datasets Audio(decode=False) value: path / bytes
    if "sampling_rate" not in inputs:
        raise ValueError("an audio dict with 'array' (or 'raw') needs its 'sampling_rate' too")
    rate = int(inputs.pop("sampling_rate"))
    inputs.pop("path", None)
    waveform = load_audio({"array": array, "sampling_rate": rate}, rate)
    stride = inputs.get("stride")
    if stride is not None and rate != sampling_rate:
        ratio = sampling_rate / rate
        inputs["stride"] = (int(round(stride[0] * ratio)), int(round(stride[1] * ratio)))
    return {"raw": resample(waveform, rate, sampling_rate), "sampling_rate": sampling_rate, **inputs}


class _WaveformBatching(StaticBatchingPipeline):
    """Batches of raw waveforms at bucket lengths (see the module docstring)."""

    def _mark(self, item: dict[str, Any], bucket: int | None = None) -> dict[str, Any]:
        """Record a prepared input's real length and the length it is padded to."""
        values = item.get("input_values")
        if values is None or values.dim() != 2:
            return item
        samples = values.shape[-1]
        item[_LENGTH_KEY] = torch.tensor([samples])
        item[_BUCKET_KEY] = max(bucket or 0, samples) if bucket else bucket_samples(samples, self.sampling_rate)
        return item

    @property
    def sampling_rate(self) -> int:
        return int(self.feature_extractor.sampling_rate)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Pad every waveform (and mask) of the batch to the longest bucket among them; other tensors are stacked,
        other values listed."""
        if _BUCKET_KEY not in items[0]:
            return _stack(items)
        length = max(item[_BUCKET_KEY] for item in items)
        padded = []
        for item in items:  # new dicts: the rows that fill a batch are the same object as a real one
            item = {key: value for key, value in item.items() if key != _BUCKET_KEY}
            for key in ("input_values", "attention_mask"):
                if key in item:
                    item[key] = torch.nn.functional.pad(item[key], (0, length - item[key].shape[-1]))
            padded.append(item)
        return _stack(padded)


def _stack(items: list[dict[str, Any]]) -> dict[str, Any]:
    keys = list(items[0])
    if any(list(item) != keys for item in items):
        raise ValueError("the inputs of one batch were prepared with different keys; they cannot be batched")
    batch = {}
    for key in keys:
        values = [item[key] for item in items]
        batch[key] = torch.cat(values) if isinstance(values[0], torch.Tensor) else values
    return batch


class IPUAudioClassificationPipeline(AudioClassificationPipeline, _WaveformBatching):
    """`transformers.AudioClassificationPipeline` (task `"audio-classification"`) at static shapes. Same arguments
    (`top_k`, `function_to_apply`) and outputs (`[{"score", "label"}, ...]`); inputs are decoded without FFmpeg
    (see `optimum_ipu.pipelines.audio.load_audio`) and padded to bucket lengths."""

    model_mapping = "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"
    processors = ("feature_extractor",)

    def preprocess(self, inputs: Any) -> dict[str, Any]:
        decoded = _decode(inputs, self.sampling_rate)
        return self._mark(dict(super().preprocess(decoded)))

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
        model_inputs.pop(_LENGTH_KEY, None)
        return self.run_model(model_inputs)

    def postprocess(self, model_outputs: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
        return super().postprocess(SequenceClassifierOutput(logits=model_outputs["logits"]), **kwargs)


class IPUAutomaticSpeechRecognitionPipeline(AutomaticSpeechRecognitionPipeline, _WaveformBatching):
    """`transformers.AutomaticSpeechRecognitionPipeline` (task `"automatic-speech-recognition"`) at static shapes,
    for CTC models (Wav2Vec2, HuBERT) and Whisper. Same arguments (`chunk_length_s`, `stride_length_s`,
    `return_timestamps`, `generate_kwargs`, ...) and outputs (`{"text"}`, with `"chunks"` for timestamps): long
    audio is cut in overlapping chunks with strides as `transformers` cuts it, the chunks of all inputs batched
    together. Whisper inputs longer than 30 s need `chunk_length_s=30` (long-form generation has no static shapes)."""

    model_mapping = "MODEL_FOR_CTC_MAPPING_NAMES|MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"
    processors = ("feature_extractor", "tokenizer")
    chunked = True

    def __init__(self, *args: Any, precision: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, precision=precision, **kwargs)
        self.encoder_engine: Engine | None = None
        if self.type == "seq2seq_whisper" and not any(p.is_meta for p in self.model.parameters()):
            # the encoder runs apart, once per input, in its own precision (`encoder_precision`: bf16 on CPUs that
            # compute it natively); the decoding loop gets its output (see `_transcribe`)
            self.encoder_engine = Engine(
                self.model.get_encoder(),
                self.ipu_config,
                precision=encoder_precision(self.device, precision),
                device=self.device,
            )

    def speed_path(self) -> str:
        """How this pipeline runs its model, in words (e.g. for a benchmark's report)."""
        if self.encoder_engine is None:
            return f"{self.runner.backend}, {self.runner.precision}"
        return f"encoder {self.encoder_engine.precision}, decoder {self.runner.precision}"

    def preprocess(self, inputs: Any, chunk_length_s: float = 0, stride_length_s: Any = None) -> Any:
        decoded = _decode(inputs, self.sampling_rate)
        if self.type == "seq2seq_whisper":
            samples = len(decoded["raw"] if isinstance(decoded, dict) else decoded)
            if not chunk_length_s and samples > self.feature_extractor.n_samples:
                raise ValueError(
                    f"automatic-speech-recognition: {samples / self.sampling_rate:.1f} s of audio is longer than "
                    "Whisper's 30 s window; pass chunk_length_s=30 (static shapes have no long-form generation)"
                )
        chunk = int(round(chunk_length_s * self.sampling_rate)) if chunk_length_s else None
        for item in super().preprocess(decoded, chunk_length_s=chunk_length_s, stride_length_s=stride_length_s):
            yield self._mark(dict(item), chunk)

    def _forward(self, model_inputs: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        samples = model_inputs.pop(_LENGTH_KEY, None)
        if self.type not in ("ctc", "seq2seq_whisper"):
            raise ValueError(
                f"automatic-speech-recognition at static shapes runs CTC models and Whisper, not {self.type!r} ones"
            )
        if self.type == "seq2seq_whisper":
            generate_kwargs = kwargs.pop("generate_kwargs", None) or {}
            kwargs = {**kwargs, **generate_kwargs}
            kwargs.setdefault("cache_implementation", speech_cache_implementation(self.device))
            if self.encoder_engine is not None and not _needs_stock_forward(kwargs, self.model.generation_config):
                return self._transcribe(model_inputs, kwargs)
            with self.engine.autocast():
                return super()._forward(model_inputs, **kwargs)
        stride = model_inputs.pop("stride", None)
        is_last = model_inputs.pop("is_last")
        inputs = {key: model_inputs.pop(key) for key in ("input_values", "attention_mask") if key in model_inputs}
        tokens = self.run_model(inputs)["logits"].argmax(dim=-1)
        if samples is not None:  # frames past each input's own length read as CTC blanks (the pad token)
            frames = self.model._get_feat_extract_output_lengths(samples).to(tokens.device)
            past = torch.arange(tokens.shape[1], device=tokens.device)[None, :] >= frames[:, None]
            tokens = tokens.masked_fill(past, self.tokenizer.pad_token_id)
        out = {"tokens": tokens}
        if stride is not None:
            ratio = 1 / self._align_to
            out["stride"] = (
                rescale_stride([stride], ratio)[0] if isinstance(stride, tuple) else rescale_stride(stride, ratio)
            )
        return {"is_last": is_last, **out, **model_inputs}

    def _transcribe(self, model_inputs: dict[str, Any], generate_kwargs: dict[str, Any]) -> dict[str, Any]:
        """`transformers`' Whisper `_forward` for plain transcription, the encoder run apart by `encoder_engine` and
        its output given to `generate()` (which then only decodes): the same tokens, the encoder in its own
        precision."""
        stride = model_inputs.pop("stride", None)
        is_last = model_inputs.pop("is_last")
        attention_mask = model_inputs.pop("attention_mask", None)
        features = model_inputs.pop("input_features")
        model_inputs.pop("num_frames", None)
        generate_kwargs = {
            k: v for k, v in generate_kwargs.items() if k not in ("return_timestamps", "return_language")
        }
        hidden = self.encoder_engine.eval_step({"input_features": features})["last_hidden_state"]
        encoded = BaseModelOutput(last_hidden_state=hidden.to(self.model.dtype))
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        with self.engine.autocast():
            if _one_decoding(generate_kwargs):  # the cross-attention computed once per input, not once per beam
                generate_kwargs.pop("cache_implementation")
                beams = max(generate_kwargs.get("num_beams") or 1, generate_kwargs.get("num_return_sequences") or 1)
                cache = cross_attention_cache(self.model, encoded, beams)
                generate_kwargs[cache_keyword(self.model)] = cache
            with weight_major_projection(self.model):
                tokens = self.model.generate(encoder_outputs=encoded, attention_mask=attention_mask, **generate_kwargs)
        out = {"tokens": tokens["sequences"] if isinstance(tokens, dict) else tokens}
        if stride is not None:
            out["stride"] = stride
        return {"is_last": is_last, **out, **model_inputs}


# `generate()` arguments under which Whisper may decode an input more than once (temperature fallback, previous
# segments): a cache given to it would then be reused; such calls let `generate()` make its own
_REDECODING = ("temperature", "compression_ratio_threshold", "logprob_threshold", "no_speech_threshold", "prompt_ids")


def _one_decoding(generate_kwargs: dict[str, Any]) -> bool:
    """Whether this Whisper call decodes each input once with the dynamic cache (where `cross_attention_cache`
    applies)."""
    redecodes = any(generate_kwargs.get(key) is not None for key in _REDECODING)
    return (
        generate_kwargs.get("cache_implementation") == "dynamic"
        and not redecodes
        and not generate_kwargs.get("do_sample")
    )


def _needs_stock_forward(kwargs: dict[str, Any], generation_config: Any) -> bool:
    """Whether a Whisper call asks for what only `transformers`' own `_forward` returns (timestamps, the language)
    or decodes without `_prepare_generate_kwargs` (older `transformers`)."""
    timestamps = kwargs.get("return_timestamps") or getattr(generation_config, "return_timestamps", False)
    stock_only = timestamps or kwargs.get("return_language")
    return bool(stock_only) or not hasattr(AutomaticSpeechRecognitionPipeline, "_prepare_generate_kwargs")
