"""Whisper tiny.en with int8 linear weights against fp32, on the 250 recordings of the FSDD test split (issue 41,
item 4): Optimum Graphcore's `parallelize(use_group_quantized_linears=True)` (here torchao's weight-only int8, one
scale per group of 128 inputs: `optimum_ipu.runtime.quantization`) beside the same model unquantized, in one process.

Both transcribe every recording one at a time (batch 1), greedy as the notebook (`num_beams=1`, `max_length=448`),
the two models in turn on each recording (which goes first alternates); the clock covers `generate()` only (the
log-mel features are computed once, before). Printed, each as int8 over the plain model (fp32; fp16 with `--half`):

- word error rate against the `transcription` column, after Whisper's English normalizer (the seq2seq example's
  scoring: spelled digits and digits are the same word), scored by jiwer; the difference in points;
- p50 seconds per recording (depends on the machine's load: the script prints the load average beside it);
- the bytes of the weights in memory (int8 values, scales and zero points of the quantized ones);
- the resident memory of each model in a child process of its own (`--memory-child`, Linux only), less the
  process's before the model was loaded: at the peak of loading (the int8 model is loaded in fp32, then quantized),
  once loaded (after `malloc_trim`: glibc keeps the pages the fp32 weights freed until then) and at the peak of
  transcribing `--memory-clips` recordings;
- the bytes of `save_pretrained`'s safetensors.

`--half` runs both in fp16 after `.half()`, as the notebook does.

    python benchmarks/whisper_quantized.py [--model ../shared/models/whisper-tiny.en] [--clips 250] [--half]
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jiwer
import torch
import transformers
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.pipelines.audio import load_audio

SHARED = Path(os.environ.get("OPTIMUM_IPU_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
RATE = 16_000
KINDS = ("plain", "int8")  # the model as loaded (fp32, or fp16 with --half), and quantized
PARALLELIZE = {"use_cache": True, "num_beams": 1, "max_length": 448}  # the notebook's, less its IPU-only ones
GENERATE = {**PARALLELIZE, "min_length": 3}


def fsdd_test(clips: int) -> list[tuple[str, object]]:
    """(transcription, 16 kHz waveform) of the first `clips` rows of the FSDD test split's metadata.csv."""
    folder = SHARED / "audio" / "fsdd" / "test"
    with (folder / "metadata.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))[:clips]
    return [(row["transcription"], load_audio(str(folder / row["file_name"]), RATE)) for row in rows]


def build(model_dir: str, kind: str, half: bool) -> torch.nn.Module:
    """The notebook's model: the stock Whisper, pipelined on one device slot and parallelized for generation."""
    model = transformers.WhisperForConditionalGeneration.from_pretrained(model_dir)
    pipelined = to_pipelined(model, IPUConfig(ipus_per_replica=1)).parallelize(
        for_generation=True, use_group_quantized_linears=kind == "int8", **PARALLELIZE
    )
    return pipelined.half() if half else pipelined


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights in memory, each tensor once (tied ones too); a torchao tensor by its inner tensors."""

    def size(tensor: torch.Tensor) -> int:
        if hasattr(tensor, "__tensor_flatten__"):  # torchao: int8 values, scales, zero points
            names, _ = tensor.__tensor_flatten__()
            return sum(size(getattr(tensor, name)) for name in names)
        return tensor.numel() * tensor.element_size()

    unique = {id(t): t for t in model.state_dict(keep_vars=True).values()}
    return sum(size(t) for t in unique.values())


def saved_bytes(model: torch.nn.Module) -> int:
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        return sum(path.stat().st_size for path in Path(folder).glob("*.safetensors"))


def rss_kib(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def memory_child(args: argparse.Namespace) -> None:
    """One model alone: its resident memory (less the process's before loading it) at the peak of loading (and
    quantizing), once loaded, and at the peak of transcribing `--memory-clips` recordings, in KiB."""
    processor = transformers.WhisperProcessor.from_pretrained(args.model)
    data = [processor(wave, sampling_rate=RATE, return_tensors="pt").input_features for _, wave in fsdd_test(4)]
    before = rss_kib()
    model = build(args.model, args.memory_child, args.half)
    load_peak = rss_kib("VmHWM") - before
    gc.collect()
    # glibc keeps the pages freed by the replaced fp32 weights mapped until trimmed; a process reuses them (the peak
    # below would include them), so give them back first to see what the model needs
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    loaded = rss_kib() - before
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the peak, to the current resident size
    for i in range(args.memory_clips):
        features = data[i % len(data)]
        model.generate(features.half() if args.half else features, **GENERATE)
    print(json.dumps({"load_peak": load_peak, "loaded": loaded, "peak": rss_kib("VmHWM") - before}))


def peak_memory(args: argparse.Namespace, kind: str) -> dict[str, int]:
    command = [sys.executable, __file__, "--model", args.model, "--memory-child", kind]
    command += ["--memory-clips", str(args.memory_clips)] + (["--half"] if args.half else [])
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def transcribe(args: argparse.Namespace) -> dict[str, dict]:
    """Each model's transcripts and seconds per recording, the two in turn on every recording."""
    processor = transformers.WhisperProcessor.from_pretrained(args.model)
    models = {kind: build(args.model, kind, args.half) for kind in KINDS}
    data = fsdd_test(args.clips)
    results = {kind: {"texts": [], "seconds": []} for kind in KINDS}
    warm = processor(data[0][1], sampling_rate=RATE, return_tensors="pt").input_features
    for model in models.values():  # warm-up: oneDNN picks its kernels for the shapes
        model.generate(warm.half() if args.half else warm, **GENERATE)
    for i, (_, wave) in enumerate(data):
        features = processor(wave, sampling_rate=RATE, return_tensors="pt").input_features
        features = features.half() if args.half else features
        for kind in KINDS if i % 2 == 0 else reversed(KINDS):
            start = time.perf_counter()
            ids = models[kind].generate(features, **GENERATE)
            results[kind]["seconds"].append(time.perf_counter() - start)
            results[kind]["texts"].append(processor.batch_decode(ids, skip_special_tokens=True)[0])
    normalize = EnglishTextNormalizer(getattr(processor.tokenizer, "english_spelling_normalizer", None) or {})
    references = [normalize(text) for text, _ in data]
    for kind, result in results.items():
        result["wer"] = jiwer.wer(references, [normalize(text) or "<empty>" for text in result["texts"]])
        result["weights"] = weight_bytes(models[kind])
        result["saved"] = saved_bytes(models[kind])
    return results


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def report(args: argparse.Namespace, results: dict[str, dict], memory: dict[str, dict[str, int]]) -> None:
    """Print each figure of the plain model (fp32, or fp16 with `--half`) and the int8 one, and int8's over plain's."""
    plain, int8 = results["plain"], results["int8"]
    base = "fp16" if args.half else "fp32"  # the unquantized model's weights
    p50 = {kind: statistics.median(results[kind]["seconds"]) for kind in KINDS}
    same = sum(a == b for a, b in zip(plain["texts"], int8["texts"], strict=True))
    print(f"Whisper tiny.en, FSDD test ({args.clips} recordings), batch 1, greedy, "
          f"{'fp16 (.half())' if args.half else 'fp32'} activations; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; load average {load_average()}")  # fmt: skip
    print(f"WER: {base} {100 * plain['wer']:.2f}%, int8 {100 * int8['wer']:.2f}% "
          f"({100 * (int8['wer'] - plain['wer']):+.2f} points); same transcript {same}/{args.clips}")  # fmt: skip
    print(f"p50 per recording: {base} {p50['plain']:.3f} s, int8 {p50['int8']:.3f} s, "
          f"int8 / {base} {p50['int8'] / p50['plain']:.2f} (provisional: depends on the load)")  # fmt: skip
    print(f"weights in memory: {base} {plain['weights'] / 2**20:.1f} MiB, int8 {int8['weights'] / 2**20:.1f} MiB, "
          f"int8 / {base} {int8['weights'] / plain['weights']:.2f}")  # fmt: skip
    moments = (("peak of loading", "load_peak"), ("once loaded", "loaded"), ("peak of transcribing", "peak"))
    for moment, key in moments:
        mib = {kind: memory[kind][key] / 1024 for kind in KINDS}
        print(f"resident memory, {moment} (less the process's before): {base} {mib['plain']:.1f} MiB, "
              f"int8 {mib['int8']:.1f} MiB, int8 / {base} {mib['int8'] / mib['plain']:.2f}")  # fmt: skip
    print(f"save_pretrained safetensors: {base} {plain['saved'] / 2**20:.1f} MiB, "
          f"int8 {int8['saved'] / 2**20:.1f} MiB, int8 / {base} {int8['saved'] / plain['saved']:.2f}")  # fmt: skip
    print(f"load average after: {load_average()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(SHARED.parent / "models" / "whisper-tiny.en"))
    parser.add_argument("--clips", type=int, default=250, help="recordings of the FSDD test split (250: all)")
    parser.add_argument("--half", action="store_true", help="both models in fp16 after .half(), as the notebook")
    parser.add_argument("--memory-clips", type=int, default=8, help="recordings each memory child transcribes")
    parser.add_argument("--memory-child", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args)
        return
    results = transcribe(args)
    report(args, results, {kind: peak_memory(args, kind) for kind in KINDS})


if __name__ == "__main__":
    main()
