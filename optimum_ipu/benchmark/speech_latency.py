"""`optimum-ipu benchmark --mode latency --task automatic-speech-recognition`: transcribing recordings one at a time.

Two runners transcribe the same requests, each a decoded waveform (16 kHz mono; decoding and resampling are done
once, before the clock), one request at a time (batch 1), from the waveform in to the text out (log-mel features,
encoder, decoding, detokenization), in rounds of alternating order (`latency.measure_in_rounds`):

- ours: `optimum_ipu.pipelines.pipeline("automatic-speech-recognition", model=...)` as a user builds it (on a CPU its
  speed path: `optimum_ipu.pipelines.speech`);
- `transformers.pipeline("automatic-speech-recognition", model=...)` on the same model folder.

Both generate with the same settings: the model's generation config, and where it says nothing, the defaults that
`transformers`' pipeline adds (for Whisper tiny.en: beam search with 5 beams, at most 448 tokens); the report names
them. The requests are `jfk.flac` (11 s, read `JFK_REPEATS` times) and `--steps` clips of the FSDD test split
(spoken digits under 1 s, 8 kHz upsampled), the digits and speakers in turn, from the shared data folder
(`OPTIMUM_IPU_SHARED_DATA`, default `../shared/data`). The report gives each runner's p50 per kind of request, ours
over `transformers`' in the same run, whether the transcripts are the same, and each runner's word error rate
against the reference transcripts after Whisper's English normalizer.
"""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from ..serving.settings import SPEECH_TASK
from .latency import measure_in_rounds
from .latency_report import latency_versions, percentiles
from .qa_runners import ModelClock
from .report import device_name, pyplot, save_figure, write_report

SHARED_DATA_ENV = "OPTIMUM_IPU_SHARED_DATA"
DEFAULT_SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
JFK_TEXT = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."
JFK_REPEATS = 6
RATE = 16_000
OURS = "optimum-ipu pipeline"
THEIRS = "transformers pipeline"

Request = tuple[str, np.ndarray, str]  # kind ("jfk" or "fsdd"), the 16 kHz waveform, the reference transcript


def shared_data() -> Path:
    """The shared data folder (`OPTIMUM_IPU_SHARED_DATA`, default `../shared/data` beside the checkout)."""
    return Path(os.environ.get(SHARED_DATA_ENV, DEFAULT_SHARED_DATA))


def speech_files(clips: int, jfk_repeats: int = JFK_REPEATS) -> list[tuple[str, Path, str]]:
    """`jfk.flac` `jfk_repeats` times, then `clips` FSDD test recordings (digit 0, 1, ... with the speakers in turn):
    each request's kind (`"jfk"` or `"fsdd"`), file and reference transcript."""
    data = shared_data()
    jfk = data / "fixtures" / "audio" / "jfk.flac"
    folder = data / "audio" / "fsdd" / "test"
    if not jfk.is_file() or not (folder / "metadata.csv").is_file():
        raise ValueError(
            f"--task {SPEECH_TASK}: the recordings are read from {data} (fixtures/audio/jfk.flac and "
            f"audio/fsdd/test); set {SHARED_DATA_ENV} to the shared data folder"
        )
    with open(folder / "metadata.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    speakers = sorted({row["speaker"] for row in rows})
    by_key: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        by_key.setdefault((row["label"], row["speaker"]), []).append(row)
    picked = []
    for i in range(clips):  # digit i % 10 by speaker i // 10 (in turn), a take not yet used
        takes = by_key[(str(i % 10), speakers[(i // 10) % len(speakers)])]
        picked.append(takes[(i // (10 * len(speakers))) % len(takes)])
    files = [("jfk", jfk, JFK_TEXT)] * jfk_repeats
    return files + [("fsdd", folder / r["file_name"], r["transcription"]) for r in picked]


def speech_requests(clips: int, jfk_repeats: int = JFK_REPEATS) -> list[Request]:
    """The requests of `speech_files`, decoded and resampled to 16 kHz (each file once)."""
    from ..pipelines.audio import load_audio

    decoded: dict[Path, np.ndarray] = {}
    requests = []
    for kind, path, text in speech_files(clips, jfk_repeats):
        if path not in decoded:
            decoded[path] = load_audio(str(path), RATE)
        requests.append((kind, decoded[path], text))
    return requests


def _transcriber(asr: Any, generate_kwargs: dict[str, Any]) -> tuple[Any, ModelClock]:
    """A runner of `measure_in_rounds`: a batch of one waveform in, its text out (its clock, unused, stays at 0:
    the time is reported end to end)."""

    def transcribe(batch: list[Request]) -> list[str]:
        return [asr(speech, generate_kwargs=dict(generate_kwargs))["text"] for _, speech, _ in batch]

    return transcribe, ModelClock()


def speech_runners(model: str, ipu_config: str | None, generate_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Ours and `transformers`' pipeline on the model folder `model`, each with its own copy of the model."""
    from ..pipelines import pipeline

    ours = pipeline(SPEECH_TASK, model=model, ipu_config=ipu_config)
    theirs = transformers.pipeline(SPEECH_TASK, model=model, device=-1)
    return {
        f"{OURS} ({ours.speed_path()})": _transcriber(ours, generate_kwargs),
        THEIRS: _transcriber(theirs, generate_kwargs),
    }


def word_error_rate(hypotheses: list[str], references: list[str]) -> float:
    """`jiwer`'s word error rate over all the recordings (words substituted, deleted and inserted over the reference
    words), both sides first through Whisper's English normalizer (which also writes spelled numbers as digits)."""
    import jiwer
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    normalize = EnglishTextNormalizer({})
    return jiwer.wer([normalize(r) for r in references], [normalize(h) for h in hypotheses])


def generation_settings(model: str, generate_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What both runners generate with: the call's arguments over the model's generation config, over the defaults
    of `transformers`' pipeline (`num_beams`, `max_new_tokens`) where the config sets neither."""
    config = transformers.GenerationConfig.from_pretrained(model)
    defaults = transformers.AutomaticSpeechRecognitionPipeline._default_generation_config
    settings = {"num_beams": config.num_beams, "max_length": config.max_length}
    if "num_beams" not in config.to_diff_dict():
        settings["num_beams"] = defaults.num_beams
    if "max_length" not in config.to_diff_dict():
        settings = {**settings, "max_length": None, "max_new_tokens": defaults.max_new_tokens}
    return {**settings, **generate_kwargs}


def run_speech_latency_benchmark(
    model: str,
    clips: int = 20,
    warmup: int = 2,
    ipu_config: str | None = None,
    output_dir: str = "benchmark_results",
    rounds: int = 2,
    jfk_repeats: int = JFK_REPEATS,
    generate_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Time ours and `transformers`' speech-recognition pipelines on the same recordings (see the module docstring);
    write `benchmark.json` and `benchmark.png` to `output_dir`; return the report.

    Args:
        model (`str`): a speech-recognition model folder (with its feature extractor and tokenizer).
        clips (`int`): FSDD test clips timed, after `jfk_repeats` readings of `jfk.flac`.
        warmup (`int`): untimed requests (of `jfk.flac`) before each runner's rounds.
        rounds (`int`): rounds of timing, every runner in turn (see `measure_in_rounds`).
        generate_kwargs (`dict`, *optional*): `generate()` arguments of both runners (e.g. `max_new_tokens`).
    """
    if not os.path.isdir(model):
        raise ValueError(f"--model {model!r}: --task {SPEECH_TASK} takes a model folder (e.g. whisper-tiny.en)")
    generate_kwargs = dict(generate_kwargs or {})
    requests = speech_requests(clips, jfk_repeats)
    batches = [[requests[0]]] * warmup + [[request] for request in requests]
    runners = speech_runners(model, ipu_config, generate_kwargs)
    measured = measure_in_rounds(runners, batches, warmup, rounds)
    report = speech_report(measured, model, requests, generation_settings(model, generate_kwargs))
    write_report(report, output_dir, speech_chart)
    return report


def speech_report(
    measured: dict[str, dict], model: str, requests: list[Request], settings: dict[str, Any]
) -> dict[str, Any]:
    """The report: each runner's p50 per kind of request, WER, the transcripts' agreement,
    and ours over `transformers`' per kind."""
    kinds = {kind: [i for i, (k, _, _) in enumerate(requests) if k == kind] for kind in ("jfk", "fsdd")}
    references = [text for _, _, text in requests]
    theirs = next(name for name in measured if name == THEIRS)
    results = []
    for name, m in measured.items():
        result: dict[str, Any] = {"name": name}
        for kind, indexes in kinds.items():
            if indexes:
                result[kind] = percentiles([m["times"][i] for i in indexes])
        result["wer"] = word_error_rate(m["answers"], references)
        same = sum(a == b for a, b in zip(m["answers"], measured[theirs]["answers"], strict=True))
        result["transcripts_equal_to_transformers"] = same / len(references)
        result["transcripts"] = {kind: sorted(set(m["answers"][i] for i in idx))[:3] for kind, idx in kinds.items()}
        results.append(result)
    ours = results[0]
    ratios = {
        f"ours p50 / {THEIRS} p50 ({label})": ours[kind]["p50_ms"] / results[-1][kind]["p50_ms"]
        for kind, label in (("jfk", "jfk.flac, 11 s"), ("fsdd", "FSDD clips, <1 s"))
        if kind in ours
    }
    return {
        "mode": "latency",
        "task": SPEECH_TASK,
        "model": "/".join(Path(model).resolve().parts[-2:]),
        "batch_size": 1,
        "requests": {kind: len(indexes) for kind, indexes in kinds.items()},
        "generation": settings,
        "threads": torch.get_num_threads(),
        "device": device_name(),
        "precision": "pipeline default (ours: see its name); transformers fp32",
        "compile": False,
        "anchors": {},
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "versions": latency_versions(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "results": results,
        "ratios": ratios,
    }


def speech_chart(report: dict, path: str) -> None:
    """Bars of p50 milliseconds per request, per runner and kind of request."""
    plt = pyplot()
    results = report["results"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 1.5 + 0.6 * len(results)))
    for ax, (kind, label) in zip(axes, (("jfk", "jfk.flac (11 s)"), ("fsdd", "FSDD clips (<1 s)")), strict=True):
        names = [r["name"] for r in results if kind in r]
        values = [r[kind]["p50_ms"] for r in results if kind in r]
        ax.barh(names, values, color=["tab:blue"] + ["tab:gray"] * (len(values) - 1))
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:.0f}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"{label}: ms per request, p50")
    fig.suptitle(
        f"{report['model']} speech recognition, batch 1, {report['device']}, {report['threads']} threads", fontsize=9
    )
    save_figure(fig, path)


def format_speech_report(report: dict) -> str:
    """The report as a table: one line per runner, then the settings, load and ratios."""
    lines = [f"{'runner':52s} {'jfk p50 ms':>11s} {'FSDD p50 ms':>12s} {'WER':>6s} {'= transformers':>15s}"]
    for r in report["results"]:
        jfk = f"{r['jfk']['p50_ms']:11.1f}" if "jfk" in r else f"{'n/a':>11s}"
        fsdd = f"{r['fsdd']['p50_ms']:12.1f}" if "fsdd" in r else f"{'n/a':>12s}"
        lines.append(f"{r['name']:52s} {jfk} {fsdd} {r['wer']:6.3f} {r['transcripts_equal_to_transformers']:15.1%}")
    counts = report["requests"]
    lines.append(
        f"{counts['jfk']} readings of jfk.flac and {counts['fsdd']} FSDD clips, batch 1; generation "
        f"{report['generation']}; load average {report['load_average']}"
    )
    lines += [f"{name}: {ratio:.3f}" for name, ratio in report["ratios"].items()]
    return "\n".join(lines)


__all__ = [
    "SPEECH_TASK",
    "run_speech_latency_benchmark",
    "format_speech_report",
    "word_error_rate",
    "speech_files",
    "speech_requests",
]
