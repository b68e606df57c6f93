"""`optimum-ipu benchmark --mode serve --task automatic-speech-recognition`: transcriptions, ours against
`transformers serve`, on the same model and the same uploads.

Both servers load the same speech recognition model (Whisper) and get the same multipart uploads at
`/v1/audio/transcriptions`: `jfk.flac` (11 s, 44.1 kHz stereo FLAC) and `RECORDING_CLIPS` FSDD test recordings (spoken
digits under 1 s, 8 kHz WAV) from the shared data folder, in turn (request `i` sends recording `i % 8`). Both decode as
the model's generation config says: `transformers serve` calls `generate()` with it, and ours is given the config's
`num_beams` with `--generate-kwargs` (its pipeline's default, as `transformers.pipeline`'s, is Whisper's 5 beams).
Neither server reports usage for a transcription: each answer's tokens are counted here with the model's tokenizer
(its text without special tokens), so the same text counts the same for both. The report adds each server's transcript
of each recording (`first_text`), whether it gave one text per recording at every level (`consistent`), and its word
error rate against the references (`speech_latency.word_error_rate`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..serving.settings import SPEECH_TASK
from .serve_load import SERVERS, TRANSCRIPTIONS, WARMUP_REQUESTS
from .serve_report import all_ratios, text_agreement

RECORDING_CLIPS = 7  # FSDD recordings beside jfk.flac: 8 in turn, so that a level of 8 in flight holds each once


def recordings() -> list[tuple[str, Path, str]]:
    """`jfk.flac` then `RECORDING_CLIPS` FSDD test recordings: each one's kind, file and reference transcript."""
    from .speech_latency import speech_files

    return speech_files(RECORDING_CLIPS, jfk_repeats=1)


def transcription_bodies(model: str, files: list[tuple[str, Path, str]], count: int) -> list[dict[str, Any]]:
    """`count` request bodies, the recordings in turn: the model's name and the upload (`(file name, bytes)`)."""
    data = {path: path.read_bytes() for _, path, _ in files}
    picked = [files[i % len(files)][1] for i in range(count)]
    return [{"model": model, "file": (path.name, data[path])} for path in picked]


def generation_config_decoding(model: str) -> dict[str, Any]:
    """How `generate()` decodes by the model's generation config (what `transformers serve` calls it with):
    `{"num_beams": N}`, for ours' `--generate-kwargs`."""
    import transformers

    try:
        config = transformers.GenerationConfig.from_pretrained(model)
    except OSError:  # no generation_config.json: generate() starts from GenerationConfig's defaults
        config = transformers.GenerationConfig()
    return {"num_beams": config.num_beams or 1}


class Transcripts:
    """What one server answered for each recording, and its answers' tokens (`tokens_of`, for `send_load`)."""

    def __init__(self, names: list[str], count_tokens: Callable[[str], int]) -> None:
        self.names, self.count_tokens = names, count_tokens
        self.heard: dict[str, str] = {}
        self.varied: set[str] = set()  # recordings answered with another text at some request

    def tokens_of(self, index: int, answer: Any) -> int:
        name, text = self.names[index % len(self.names)], answer["text"]
        if self.heard.setdefault(name, text) != text:
            self.varied.add(name)
        return self.count_tokens(text)


def measure_transcription(
    model: str,
    keys: list[str],
    concurrency: tuple[int, ...],
    requests: int,
    output_dir: str,
    run: Callable[..., dict[str, Any]],
) -> dict[str, Any]:
    """Every chosen server in turn on the same uploads (`run`: `serve.run_server`, its backend bound); the report's
    request mix, servers (with their transcripts, consistency and word error rate), ratios and agreement."""
    import soundfile
    import transformers

    from .speech_latency import word_error_rate

    files = recordings()
    names = [path.name for _, path, _ in files]
    references = {path.name: text for _, path, text in files}
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    count_tokens = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    decoding = generation_config_decoding(model)
    bodies = (transcription_bodies(model, files, WARMUP_REQUESTS), transcription_bodies(model, files, requests))
    servers = []
    total = len(keys) * len(concurrency) * requests
    with tqdm(total=total, desc="benchmark (serve, transcriptions)", unit="request") as bar:
        for key in keys:
            bar.set_postfix_str(SERVERS[key].name)
            heard = Transcripts(names, count_tokens)
            told = decoding if key == "ours" else None  # the peer decodes by the generation config already
            measure = {"tokens_of": heard.tokens_of, "generate_kwargs": told}
            server = run(key, model, SPEECH_TASK, bodies, concurrency, output_dir, bar.update, **measure)
            server["first_text"] = heard.heard  # every recording's transcript (compared across the servers)
            server["consistent"] = not heard.varied
            server["wer"] = word_error_rate(list(heard.heard.values()), [references[n] for n in heard.heard])
            servers.append(server)
    mix = {
        "endpoint": TRANSCRIPTIONS,
        "recordings": [
            {"file": path.name, "kind": kind, "seconds": soundfile.info(str(path)).duration, "reference": text}
            for kind, path, text in files
        ],
        "decoding": decoding,
        "tokens": "each answer's text through the model's tokenizer, without special tokens",
        "requests_per_concurrency": requests,
        "concurrency": list(concurrency),
        "warmup_requests": WARMUP_REQUESTS,
        "order": f"request i of a level uploads recordings[i % {len(files)}]",
    }
    agreement = text_agreement(servers)
    return {"request_mix": mix, "servers": servers, "ratios": all_ratios(servers), "first_text": agreement}


__all__ = ["SPEECH_TASK", "measure_transcription", "recordings", "generation_config_decoding", "RECORDING_CLIPS"]
