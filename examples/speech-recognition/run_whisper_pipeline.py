#!/usr/bin/env python
"""Transcribe an audio file (or URL) with Whisper through `pipeline("automatic-speech-recognition")`: Optimum
Graphcore's `examples/speech-recognition/run_whisper_pipeline.py`, with its flags.

    python run_whisper_pipeline.py ../../../shared/data/fixtures/audio/jfk.flac \\
        --model ../../../shared/models/whisper-tiny.en --use-cache --num-beams 5 --time-it

The transcript is printed between quotes on stdout; the parameters, and with `--time-it` the time of a second run, on
stderr. Its IPU-compiler knobs (`--use-encoder-output-buffer`, `--use-cond-encoder`, `--on-device-generation-steps`)
are accepted and named once as having no effect here; `--layers-per-ipu` lays the encoder and decoder out as
there (the stages run in turn in one process, the same transcript). A URL is downloaded into the current folder once,
as there.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import os
import sys
import time
from dataclasses import dataclass, field

import huggingface_hub
import transformers

from optimum_ipu import IPUConfig, pipeline
from optimum_ipu.errors import run_script

# Optimum Graphcore's layouts of its two example models (its script refused any other model without --layers-per-ipu)
START_TOKENS = 4  # <|startoftranscript|>, language, task, <|notimestamps|> (multilingual models: the most)
DEFAULT_LAYERS_PER_IPU = {"openai/whisper-tiny.en": [-1, -1], "openai/whisper-large-v2": [8, 8, 8, 8, 6, 9, 9, 8]}


@dataclass
class WhisperPipelineArguments:
    """Optimum Graphcore's flags (dashes or underscores), and an IPU config to start from."""

    input_file: str = field(metadata={"help": "An audio file (WAV, FLAC, OGG) or an http(s) URL; the first argument."})
    model: str = field(default="openai/whisper-tiny.en", metadata={"help": "A Whisper model id or folder."})
    ipu_config_name: str | None = field(
        default=None, metadata={"help": "An IPU config to start from (its inference layout); the flags below win."}
    )
    layers_per_ipu: list[int] | None = field(
        default=None, metadata={"help": "Encoder and decoder layers per stage (default: the model's, [-1, -1])."}
    )
    use_cache: bool = field(default=False, metadata={"help": "Decode with the self-attention KV cache."})
    use_encoder_output_buffer: bool = field(default=False, metadata={"help": "IPU-only: no effect here."})
    use_cond_encoder: bool = field(default=False, metadata={"help": "IPU-only (one stage): layers_per_ipu [-1]."})
    on_device_generation_steps: int = field(default=1, metadata={"help": "IPU-only: no effect here."})
    do_sample: bool = field(default=False, metadata={"help": "Sample instead of greedy or beam search."})
    batch_size: int = field(default=1, metadata={"help": "Audio chunks per batch."})
    num_beams: int = field(default=1, metadata={"help": "Beam search width."})
    replication_factor: int = field(default=1, metadata={"help": "Inference replicas (run in turn in one process)."})
    chunk_length_s: int = field(default=30, metadata={"help": "Long audio is transcribed in chunks of this length."})
    max_new_tokens: int = field(default=448, metadata={"help": "Tokens generated at most per chunk."})
    fp32: bool = field(default=False, metadata={"help": "fp32 on an accelerator (the default there is fp16)."})
    time_it: bool = field(default=False, metadata={"help": "Transcribe a second time and print how long it took."})


def local_file(input_file: str) -> str:
    """The audio file to read: the path itself, or a URL downloaded into the current folder (kept for later runs)."""
    if os.path.exists(input_file):
        return input_file
    name = os.path.basename(input_file)
    if os.path.exists(name):
        return name
    if not input_file.startswith(("http://", "https://")):
        raise ValueError(f"input_file: {input_file!r} is neither a file nor an http(s) URL; give one")
    print("Trying to download", input_file, "to current directory", file=sys.stderr)
    response = huggingface_hub.get_session().get(input_file, timeout=60)
    response.raise_for_status()
    with open(name, "wb") as file:
        file.write(response.content)
    return name


def ipu_config_of(args: WhisperPipelineArguments) -> IPUConfig:
    layers = [-1] if args.use_cond_encoder else args.layers_per_ipu or DEFAULT_LAYERS_PER_IPU.get(args.model, [-1, -1])
    knobs = {
        "use_cache": args.use_cache,
        "use_encoder_output_buffer": args.use_encoder_output_buffer,
        "use_cond_encoder": args.use_cond_encoder,
        "on_device_generation_steps": args.on_device_generation_steps,
        "num_beams": args.num_beams,
        "batch_size": args.batch_size,
    }
    # the inference knobs (Optimum Graphcore passed them as `parallelize_kwargs` to the model it generated with):
    # use_cache, num_beams and batch_size become generation defaults, the IPU-only ones are named once
    fields = {
        "layers_per_ipu": layers,
        "inference_replication_factor": args.replication_factor,
        "inference_parallelize_kwargs": knobs,
    }
    if args.ipu_config_name:
        return IPUConfig.from_pretrained(args.ipu_config_name, **fields)
    return IPUConfig(**fields)


def main() -> None:
    argv = sys.argv[1:]
    if argv and not argv[0].startswith("-") and not argv[0].endswith(".json"):  # the positional file of the original
        sys.argv[1:] = ["--input_file", *argv]
    (args,) = example_utils.parse_args(WhisperPipelineArguments)
    print("Parameters:", args, file=sys.stderr)
    audio = local_file(args.input_file)
    # Whisper's decoder holds max_target_positions tokens in all, its start tokens included: the original's default of
    # 448 new tokens overran it under transformers 5 (which checks); cut to what fits, said
    limit = transformers.AutoConfig.from_pretrained(args.model).max_target_positions - START_TOKENS
    if args.max_new_tokens > limit:
        print(f"--max-new-tokens {args.max_new_tokens}: {limit} at most fit after the start tokens", file=sys.stderr)
        args.max_new_tokens = limit
    asr = pipeline(
        "automatic-speech-recognition",
        model=args.model,
        ipu_config=ipu_config_of(args),
        fp16=False if args.fp32 else None,  # (Optimum Graphcore's fp16 on accelerators is the default there already)
        batch_size=args.batch_size * args.replication_factor,
        chunk_length_s=args.chunk_length_s,
        max_new_tokens=args.max_new_tokens,
        ignore_warning=True,  # transformers' note on chunked seq2seq decoding, as the original silenced it
    )
    generate = {"do_sample": args.do_sample, "num_beams": args.num_beams, "use_cache": args.use_cache}
    output = asr([audio], generate_kwargs=generate)
    print(f"'{output[0]['text']}'")
    if args.time_it:
        print("\n\nNow running it again to time it...", file=sys.stderr)
        start = time.perf_counter()
        asr([audio], generate_kwargs=generate)
        print(f"Transcription performed in {time.perf_counter() - start:.2f}s\n", file=sys.stderr)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
