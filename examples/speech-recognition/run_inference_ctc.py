#!/usr/bin/env python
"""Transcribe a batch of recordings with a Wav2Vec2 CTC model and measure its throughput: Optimum Graphcore's
`examples/speech-recognition/run_inference_ctc.py`, with its flags, through `pipeline("automatic-speech-recognition")`.

    python run_inference_ctc.py --model_name_or_path ./output/ctc-fsdd \\
        --audio_folder ../../../shared/data/audio/fsdd/test --max_samples 16000 --benchmark_iterations 10

(`./output/ctc-fsdd`: the model that README.md's CTC recipe trains; online, the default is Optimum Graphcore's
`facebook/wav2vec2-base-960h`.) Without `--audio_folder` (an `audiofolder` split: audio files and a `metadata.csv`
with `file_name` and the transcription) or `--audio_files`, the first `--num_device_iterations` samples of
LibriSpeech's dummy set are transcribed, as there (from the Hub, or its local cache). The transcriptions are printed
as a list, as there, then the word error rate against the data's own transcriptions; `--do_benchmark` (on by
default, as there) runs the model alone `--benchmark_iterations` times on a batch of `--num_device_iterations` silent
inputs of `--max_samples` samples and prints the throughput. Every flag holds here; the one IPU-only setting, the
large model's `matmul_proportion`, is kept in its config and named once as having no effect.
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
from typing import Any

import jiwer
import torch
from example_utils.audio import undecoded

from optimum_ipu import IPUConfig, pipeline
from optimum_ipu.errors import run_script
from optimum_ipu.pipelines.audio import read_audio_folder

MODELS = {False: "facebook/wav2vec2-base-960h", True: "facebook/wav2vec2-large-960h"}
# Optimum Graphcore's `patrickvonplaten/librispeech_asr_dummy` is read by a loading script, which datasets 4 runs no
# more; transformers' own copy of its 73 samples is plain parquet
LIBRISPEECH = ("hf-internal-testing/librispeech_asr_dummy", "clean", "validation")
TEXT_COLUMNS = ("text", "transcription", "sentence")  # LibriSpeech's, FSDD's, Common Voice's
# Optimum Graphcore's [17, 16] for the large model counted the 7 convolutions, the position embedding and the CTC
# head as layers; the layers here are the 24 transformer layers alone: [9, 15] is the same cut
LARGE_LAYERS_PER_IPU = [9, 15]


@dataclass
class InferenceArguments:
    """Optimum Graphcore's flags, then where the model, its IPU config and the audio come from."""

    num_device_iterations: int = field(
        default=32, metadata={"help": "Batches per host call: the rows of the batch, and the LibriSpeech samples."}
    )
    max_samples: int = field(default=320000, metadata={"help": "Samples of each input of the benchmark's batch."})
    use_large_model: bool = field(
        default=False, metadata={"help": "wav2vec2-large-960h on 2 stages, otherwise wav2vec2-base-960h on one."}
    )
    do_librispeech: bool = field(
        default=True, metadata={"help": "Transcribe LibriSpeech's dummy set (or --audio_folder / --audio_files)."}
    )
    do_benchmark: bool = field(
        default=True, metadata={"help": "Run the model alone on a batch of silence and print its throughput."}
    )
    benchmark_iterations: int = field(default=100, metadata={"help": "Host calls of the benchmark."})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A CTC model id or folder (default: as --use_large_model chooses)."}
    )
    ipu_config_name: str | None = field(
        default=None, metadata={"help": "An IPU config to run in instead (its inference layout)."}
    )
    audio_folder: str | None = field(
        default=None, metadata={"help": "An audiofolder split (metadata.csv: file_name, transcription) to transcribe."}
    )
    audio_files: list[str] | None = field(default=None, metadata={"help": "Audio files (WAV, FLAC, OGG) too."})
    text_column_name: str | None = field(
        default=None, metadata={"help": f"The transcriptions (default: the first of {', '.join(TEXT_COLUMNS)})."}
    )

    def __post_init__(self) -> None:
        for name in ("num_device_iterations", "max_samples", "benchmark_iterations"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} {getattr(self, name)}: expected a positive number")
        if (self.audio_folder or self.audio_files) and not self.do_librispeech:
            raise ValueError("--audio_folder / --audio_files with --do_librispeech false: nothing transcribes them")
        if self.audio_folder and not os.path.isdir(self.audio_folder):
            raise FileNotFoundError(f"--audio_folder {self.audio_folder}: no such folder")


def ipu_config_of(args: InferenceArguments) -> IPUConfig:
    """Optimum Graphcore's config of the model (`--ipu_config_name` instead when given), with its host batch."""
    fields: dict[str, Any] = {"inference_device_iterations": args.num_device_iterations}
    if args.ipu_config_name:
        return IPUConfig.from_pretrained(args.ipu_config_name, **fields)
    if args.use_large_model:
        fields.update(matmul_proportion=0.1, layers_per_ipu=LARGE_LAYERS_PER_IPU)
    return IPUConfig(**fields)


def load_audio_data(args: InferenceArguments) -> tuple[list[Any], list[str | None]]:
    """
    The recordings to transcribe (file paths, or LibriSpeech's undecoded audio) and their transcriptions (`None` where
    the data has none): `--audio_folder`'s rows then `--audio_files`, or LibriSpeech's first `--num_device_iterations`.
    """
    if args.audio_folder or args.audio_files:
        rows = read_audio_folder(args.audio_folder) if args.audio_folder else None
        column = text_column(args, rows.column_names) if rows else None
        folder = list(rows["audio"]) if rows else []
        references = list(rows[column]) if column else [None] * len(folder)
        return folder + list(args.audio_files or []), references + [None] * len(args.audio_files or [])
    name, config, split = LIBRISPEECH
    hint = "--audio_folder FOLDER (audiofolder layout: audio files, metadata.csv with file_name and the text)"
    try:
        rows = example_utils.load_hub_dataset(name, config, split=split, local_files_hint=hint)
    except example_utils.HubUnreachableError as err:  # (its message names a --dataset_name, a flag not here)
        raise example_utils.HubUnreachableError(str(err).replace("--dataset_name ", "", 1)) from None
    rows = undecoded(rows.select(range(min(len(rows), args.num_device_iterations))), "audio")
    column = text_column(args, rows.column_names)
    return list(rows["audio"]), list(rows[column]) if column else [None] * len(rows)


def text_column(args: InferenceArguments, columns: list[str]) -> str | None:
    """`--text_column_name` (which the data must have), else the first of `TEXT_COLUMNS` it has, else `None`."""
    if args.text_column_name is None:
        return next((name for name in TEXT_COLUMNS if name in columns), None)
    if args.text_column_name not in columns:
        raise ValueError(f"--text_column_name {args.text_column_name}: no such column (columns: {', '.join(columns)})")
    return args.text_column_name


def word_error_rate(references: list[str | None], transcriptions: list[str]) -> tuple[float, int] | None:
    """jiwer's WER over the recordings with a transcription (and how many), case and spacing aside (LibriSpeech
    and the 960h models are upper case, FSDD lower case); `None` without any."""
    pairs = [(r, t) for r, t in zip(references, transcriptions, strict=True) if r]
    if not pairs:
        return None
    words = [[" ".join(text.lower().split()) for text in texts] for texts in zip(*pairs, strict=True)]
    return jiwer.wer(*words), len(pairs)


def benchmark(asr: Any, args: InferenceArguments) -> None:
    """The model alone (no data loading, as there) on a batch of silence, after one untimed call; prints samples/s."""
    batch = {"input_values": torch.zeros(asr.host_batch_rows(), args.max_samples)}
    asr.run_model(batch)["logits"].cpu()  # (a GPU compiles its graph of this shape here)
    start = time.perf_counter()
    for _ in range(args.benchmark_iterations):
        asr.run_model(batch)["logits"].cpu()  # back on the host: the time of the whole call
    each = (time.perf_counter() - start) / args.benchmark_iterations
    rows = batch["input_values"].shape[0]
    print(
        f"Throughput: {rows / each:.2f} samples/s ({args.benchmark_iterations} iterations of a batch of {rows} x "
        f"{args.max_samples} samples, {each:.4f} s each)"
    )


def main() -> None:
    (args,) = example_utils.parse_args(InferenceArguments)
    print("Inference arguments:", args, file=sys.stderr)
    audio, references = load_audio_data(args) if args.do_librispeech else ([], [])
    model, ipu_config = args.model_name_or_path or MODELS[args.use_large_model], ipu_config_of(args)
    try:
        asr = pipeline("automatic-speech-recognition", model=model, ipu_config=ipu_config)
    except OSError as err:  # (transformers' message of a model out of reach does not name it)
        raise OSError(f"--model_name_or_path {model}: {err}") from None
    if args.do_librispeech:
        with torch.inference_mode():
            transcriptions = [output["text"] for output in asr(audio)]
        print(transcriptions)
        scored = word_error_rate(references, transcriptions)
        if scored is not None:
            print(f"WER: {scored[0]:.4f} ({scored[1]} recordings against the data's transcriptions)")
    if args.do_benchmark:
        with torch.inference_mode():
            benchmark(asr, args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
