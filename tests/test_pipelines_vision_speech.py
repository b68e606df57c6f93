"""`pipeline()` for images and speech, tested equal to `transformers`' own pipelines on the same tiny models, and the
audio decoding they share with the example scripts (`optimum_ipu.pipelines.audio`).

`transformers`' audio pipelines decode files with FFmpeg and resample with torchaudio, neither of which is here:
they are given the waveform that `load_audio` decodes (soundfile) and resamples (scipy), ours the file itself.
"""

from __future__ import annotations

import csv
import json

import jiwer
import numpy as np
import pytest
import torch
import transformers
from transformers.models.whisper.english_normalizer import BasicTextNormalizer

from optimum_ipu import IncompatibleIPUConfigError, pipeline
from optimum_ipu.pipelines.audio import AudioDecodingError, load_audio, read_audio, read_audio_folder

from .tiny_models_vision_speech import PIPELINE_WAV2VEC2, save_tiny_whisper, save_vit_classifier

RATE = 16_000
LAYOUT = {"layers_per_ipu": [1, 3], "inference_layers_per_ipu": [2, 2], "inference_device_iterations": 2}


@pytest.fixture(scope="module")
def fsdd_files(shared_data) -> list[str]:
    folder = shared_data / "audio" / "fsdd" / "test"
    return [str(folder / name) for name in ("0_george_0.wav", "3_jackson_1.wav", "7_lucas_2.wav", "9_yweweler_4.wav")]


@pytest.fixture(scope="module")
def jfk(shared_data) -> str:
    return str(shared_data / "fixtures" / "audio" / "jfk.flac")


def _saved(path, model, *processors):
    model.save_pretrained(path)
    for processor in processors:
        processor.save_pretrained(path)
    return str(path)


def _loaded(path: str, auto_class: str) -> transformers.PreTrainedModel:
    return getattr(transformers, auto_class).from_pretrained(path).eval()


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    return save_vit_classifier(tmp_path_factory.mktemp("vit"))


@pytest.fixture(scope="module")
def wav2vec2_dirs(tmp_path_factory):
    """A tiny Wav2Vec2 audio classifier and a CTC model with a letter vocabulary, each with its processors."""
    extractor = transformers.Wav2Vec2FeatureExtractor(return_attention_mask=True, do_normalize=True)
    classifier_dir = tmp_path_factory.mktemp("w2v-cls")
    torch.manual_seed(0)
    classifier = transformers.Wav2Vec2ForSequenceClassification(
        transformers.Wav2Vec2Config(**PIPELINE_WAV2VEC2, num_labels=3)
    )
    _saved(classifier_dir, classifier, extractor)
    ctc_dir = tmp_path_factory.mktemp("w2v-ctc")
    vocab = {"<pad>": 0, "<unk>": 1, "|": 2, **{c: i + 3 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz'")}}
    (ctc_dir / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = transformers.Wav2Vec2CTCTokenizer(str(ctc_dir / "vocab.json"), word_delimiter_token="|")
    ctc = transformers.Wav2Vec2ForCTC(
        transformers.Wav2Vec2Config(**PIPELINE_WAV2VEC2, vocab_size=len(vocab), pad_token_id=0)
    )
    _saved(ctc_dir, ctc, extractor, tokenizer)
    return str(classifier_dir), str(ctc_dir)


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return save_tiny_whisper(tmp_path_factory.mktemp("whisper"))


def test_image_classification_equals_transformers(vit_dir, shared_data):
    digits = sorted((shared_data / "images" / "uci-digits-8x8" / "validation").glob("*/*.png"))[:4]
    images = [str(shared_data / "fixtures" / "images" / "coco-000000039769.png"), *map(str, digits)]
    ours = pipeline("image-classification", model=vit_dir, ipu_config=LAYOUT)
    model = _loaded(vit_dir, "AutoModelForImageClassification")
    reference = transformers.pipeline("image-classification", model=model, image_processor=ours.image_processor)
    got, want = ours(images, batch_size=2, top_k=3), reference(images, top_k=3)  # 5 images: 2 host batches of 4
    assert len(got) == 5 and ours.host_batch_rows(2) == 4
    for mine, theirs in zip(got, want, strict=True):
        assert [r["label"] for r in mine] == [r["label"] for r in theirs]
        np.testing.assert_allclose([r["score"] for r in mine], [r["score"] for r in theirs], atol=1e-5)
    assert ours(images[0], top_k=1)[0]["label"] == want[0][0]["label"]  # one input: its result alone


def test_audio_classification_equals_transformers(wav2vec2_dirs, fsdd_files):
    classifier_dir, _ = wav2vec2_dirs
    ours = pipeline("audio-classification", model=classifier_dir, ipu_config=LAYOUT)
    model = _loaded(classifier_dir, "AutoModelForAudioClassification")
    reference = transformers.pipeline("audio-classification", model=model, feature_extractor=ours.feature_extractor)
    # 8 kHz files, decoded and resampled here; clips of different lengths padded to 1 s with their mask
    got = ours(fsdd_files, batch_size=2)
    want = [reference(load_audio(path, RATE)) for path in fsdd_files]
    for mine, theirs in zip(got, want, strict=True):
        assert [r["label"] for r in mine] == [r["label"] for r in theirs]
        np.testing.assert_allclose([r["score"] for r in mine], [r["score"] for r in theirs], atol=1e-5)
    eight_khz, rate = read_audio(fsdd_files[0])
    as_dict = ours({"array": eight_khz, "sampling_rate": rate})  # the datasets / transformers dict form
    np.testing.assert_allclose([r["score"] for r in as_dict], [r["score"] for r in want[0]], atol=1e-5)


def test_ctc_speech_recognition_equals_transformers(wav2vec2_dirs, fsdd_files, jfk):
    _, ctc_dir = wav2vec2_dirs
    ours = pipeline("automatic-speech-recognition", model=ctc_dir, ipu_config=LAYOUT)
    model = _loaded(ctc_dir, "AutoModelForCTC")
    reference = transformers.pipeline(
        "automatic-speech-recognition", model=model, feature_extractor=ours.feature_extractor, tokenizer=ours.tokenizer
    )
    got = ours(fsdd_files, batch_size=2)
    assert got == [reference(load_audio(path, RATE)) for path in fsdd_files]
    assert len(got[0]["text"]) > 3  # a random model spells something: frames past each clip are not read
    speech = load_audio(jfk, RATE)  # 11 s: chunks of 3 s with 0.5 s strides, batched 4 to a host call
    chunked = ours(jfk, chunk_length_s=3, stride_length_s=0.5, batch_size=2)
    assert chunked == reference(speech, chunk_length_s=3, stride_length_s=0.5)
    words = ours(jfk, chunk_length_s=3, return_timestamps="word")
    assert words == reference(speech, chunk_length_s=3, return_timestamps="word") and words["chunks"]


def test_whisper_speech_recognition_equals_transformers(whisper_dir, fsdd_files, jfk):
    ours = pipeline("automatic-speech-recognition", model=whisper_dir)
    model = _loaded(whisper_dir, "AutoModelForSpeechSeq2Seq")
    reference = transformers.pipeline(
        "automatic-speech-recognition", model=model, feature_extractor=ours.feature_extractor, tokenizer=ours.tokenizer
    )
    generate = {"max_new_tokens": 8}
    got = ours(fsdd_files[:3], batch_size=2, generate_kwargs=generate)
    assert got == [reference(load_audio(path, RATE), generate_kwargs=generate) for path in fsdd_files[:3]]
    assert all(result["text"] for result in got)
    chunked = ours(jfk, chunk_length_s=5, batch_size=2, generate_kwargs=generate)
    assert chunked == reference(load_audio(jfk, RATE), chunk_length_s=5, generate_kwargs=generate)
    long = np.tile(load_audio(jfk, RATE), 3)  # 33 s: longer than one Whisper window
    with pytest.raises(ValueError, match=r"33\.\d s of audio is longer than Whisper's 30 s window; pass chunk_len"):
        ours(long, generate_kwargs=generate)


@pytest.fixture(scope="module")
def pretrained_whisper(shared_data):
    """OpenAI's Whisper tiny.en (`../shared/models/whisper-tiny.en`): our pipeline and `transformers`' own."""
    model_dir = shared_data.parent / "models" / "whisper-tiny.en"
    ours = pipeline("automatic-speech-recognition", model=model_dir)
    return ours, transformers.pipeline("automatic-speech-recognition", model=str(model_dir))


def test_pretrained_whisper_transcribes_jfk_exactly(pretrained_whisper, jfk):
    """The 11 s JFK clip (44.1 kHz stereo FLAC, decoded and resampled here): the known transcript, word for word, and
    `transformers`' own pipeline's text."""
    ours, reference = pretrained_whisper
    said = " And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."
    assert ours(jfk) == {"text": said}
    assert reference(load_audio(jfk, RATE)) == {"text": said}


def spoken_digits(shared_data, count: int) -> tuple[np.ndarray, str]:
    """`count` FSDD test recordings, the digits 0 to 9 in turn with the speakers in turn, joined with 0.3 s of
    silence: a long recording with known words."""
    folder = shared_data / "audio" / "fsdd" / "test"
    rows = list(csv.DictReader((folder / "metadata.csv").open()))
    speakers = sorted({row["speaker"] for row in rows})
    by_key = {(row["label"], row["speaker"]): row for row in reversed(rows)}  # each digit's and speaker's first take
    picked = [by_key[(str(i % 10), speakers[(i // 10) % len(speakers)])] for i in range(count)]
    gap = np.zeros(int(0.3 * RATE), dtype=np.float32)
    speech = np.concatenate(
        [part for row in picked for part in (load_audio(str(folder / row["file_name"]), RATE), gap)]
    )
    return speech, " ".join(row["transcription"] for row in picked)


def test_pretrained_whisper_transcribes_long_audio_in_chunks_as_transformers(pretrained_whisper, shared_data):
    """Past Whisper's 30 s window: chunks of 30 s with strides, batched, give `transformers`' own text, and the
    spoken digits are heard (measured: 48 of 48, and one repeated where two chunks overlap)."""
    ours, reference = pretrained_whisper
    speech, words = spoken_digits(shared_data, 48)
    assert len(speech) > 30 * RATE
    got = ours(speech, chunk_length_s=30, batch_size=2)
    assert got == reference(speech, chunk_length_s=30, batch_size=2)
    # Whisper writes a run of spoken digits as words or as figures ("six, 6, 7"): both are read as words here
    names = "zero one two three four five six seven eight nine".split()
    heard = [names[int(w)] if w.isdigit() else w for w in BasicTextNormalizer()(got["text"]).split()]
    assert jiwer.wer(words, " ".join(heard)) < 0.1, got["text"]


def test_processors_and_classes_are_checked(vit_dir, wav2vec2_dirs, tmp_path):
    classifier_dir, _ = wav2vec2_dirs
    with pytest.raises(IncompatibleIPUConfigError, match="audio-classification: .* holds a 'vit' model"):
        pipeline("audio-classification", model=vit_dir)
    model = _loaded(vit_dir, "AutoModelForImageClassification")
    model.save_pretrained(tmp_path / "bare")  # weights without a preprocessor_config.json
    with pytest.raises(ValueError, match=r"bare: no image_processor could be loaded from it .*pass image_processor="):
        pipeline("image-classification", model=str(tmp_path / "bare"))
    processor = transformers.AutoImageProcessor.from_pretrained(vit_dir)
    built = pipeline("image-classification", model=model, image_processor=processor)  # objects: nothing loaded
    assert built.image_processor is processor and "IPUImageClassificationPipeline" in repr(built)


def test_audio_decoding(shared_data, jfk, tmp_path):
    speech, rate = read_audio(jfk)  # 44.1 kHz stereo 24-bit FLAC
    assert rate == 44_100 and speech.ndim == 1 and speech.dtype == np.float32 and 10.5 < len(speech) / rate < 11.5
    at_16k = load_audio(jfk, RATE)
    assert abs(len(at_16k) - round(len(speech) * RATE / rate)) <= 1
    clip = shared_data / "audio" / "fsdd" / "train" / "0_george_10.wav"
    eight_khz, rate = read_audio(clip)
    assert rate == 8_000 and len(load_audio(str(clip), RATE)) == 2 * len(eight_khz)
    np.testing.assert_array_equal(load_audio(clip.read_bytes(), 8_000), eight_khz)
    np.testing.assert_array_equal(load_audio({"path": str(clip), "bytes": None}, 8_000), eight_khz)
    (tmp_path / "noise.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(64))
    with pytest.raises(AudioDecodingError, match=r"noise\.mp4: cannot decode this audio .*WAV, FLAC and OGG"):
        read_audio(tmp_path / "noise.mp4")
    with pytest.raises(AudioDecodingError, match=r"missing\.wav: no such audio file"):
        load_audio(str(tmp_path / "missing.wav"), RATE)


def test_audio_folder(shared_data, tmp_path):
    test = read_audio_folder(shared_data / "audio" / "fsdd" / "test")
    assert len(test) == 250 and set(test.column_names) == {"audio", "label", "transcription", "speaker"}
    assert test[0]["audio"].endswith(".wav") and sorted(set(test["label"])) == list(range(10))
    (tmp_path / "metadata.csv").write_text("file_name,label\ngone.wav,1\n")
    with pytest.raises(FileNotFoundError, match=r"metadata\.csv lists .*gone\.wav, which is not there"):
        read_audio_folder(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty: no metadata\.csv or metadata\.jsonl"):
        read_audio_folder(tmp_path / "empty")
