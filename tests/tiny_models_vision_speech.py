"""Tiny random-weight models of the vision and speech classes, with inputs and labels, for CPU tests.

The same interface as `tests/tiny_models.py` (`tiny_config(family)`, `tiny_model(class_name)`,
`tiny_inputs(class_name)`, `scalar_objective(outputs)`) for the plans of `optimum_ipu.models.families.vision` and
`.speech`. Dropout, layer drop, drop path and SpecAugment masking are off, so two runs of the same model give the
same numbers. Every family has 4 pipeline layers (ConvNeXt: 4 stages; Whisper: 2 encoder + 2 decoder layers; its audio
classifier: 4 encoder layers).
`Wav2Vec2ForPreTraining` draws Gumbel noise in its quantizer while training: seed torch (`torch.manual_seed`)
before each forward that is compared.
"""

from __future__ import annotations

import torch
import transformers

VOCAB, BATCH, LABELS = 12, 2, 3
AUDIO_SAMPLES = 400  # 48 frames after the tiny feature encoder below
IMAGE = 32  # ConvNeXt: a 4x4 patch embedding, then 3 downsamplings by 2: 8, 4, 2, 1
MEL_BINS, MEL_FRAMES = 16, 40  # Whisper: input frames = 2 x max_source_positions
WHISPER_VOCAB = 99

FAMILY_OF = {"ConvNext": "convnext", "Wav2Vec2": "wav2vec2", "Hubert": "hubert", "Whisper": "whisper"}
CLASSES = (
    "ConvNextModel",
    "ConvNextForImageClassification",
    "Wav2Vec2Model",
    "Wav2Vec2ForPreTraining",
    "Wav2Vec2ForCTC",
    "Wav2Vec2ForSequenceClassification",
    "HubertModel",
    "HubertForCTC",
    "HubertForSequenceClassification",
    "WhisperForConditionalGeneration",
    "WhisperForAudioClassification",
)


def family_of(class_name: str) -> str:
    """The `model_type` of a class name of this module (`"Wav2Vec2ForCTC"` -> `"wav2vec2"`)."""
    for prefix, family in FAMILY_OF.items():
        if class_name.startswith(prefix):
            return family
    raise KeyError(class_name)


def tiny_config(family: str) -> transformers.PretrainedConfig:
    """A config of `family` with 4 pipeline layers, tiny widths and no randomness in training."""
    if family == "convnext":
        return transformers.ConvNextConfig(
            num_channels=3,
            hidden_sizes=[8, 16, 24, 32],
            depths=[1, 1, 1, 1],
            image_size=IMAGE,
            drop_path_rate=0.0,
            layer_scale_init_value=1.0,
            num_labels=LABELS,
        )
    if family in ("wav2vec2", "hubert"):
        config_class = transformers.Wav2Vec2Config if family == "wav2vec2" else transformers.HubertConfig
        return config_class(
            hidden_size=32,
            num_hidden_layers=4,
            num_attention_heads=2,
            intermediate_size=37,
            conv_dim=(16, 16),
            conv_kernel=(8, 4),
            conv_stride=(4, 2),
            num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=2,
            hidden_dropout=0.0,
            activation_dropout=0.0,
            attention_dropout=0.0,
            feat_proj_dropout=0.0,
            final_dropout=0.0,
            layerdrop=0.0,
            mask_time_prob=0.0,
            mask_feature_prob=0.0,
            vocab_size=VOCAB,
            pad_token_id=0,
            ctc_loss_reduction="mean",
            ctc_zero_infinity=True,
            classifier_proj_size=8,
            num_labels=LABELS,
            codevector_dim=16,
            proj_codevector_dim=16,
            num_codevectors_per_group=8,
            num_codevector_groups=2,
            num_negatives=4,
            attn_implementation="eager",
        )
    if family == "whisper":
        return transformers.WhisperConfig(
            vocab_size=WHISPER_VOCAB,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            num_mel_bins=MEL_BINS,
            max_source_positions=MEL_FRAMES // 2,
            max_target_positions=32,
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            encoder_layerdrop=0.0,
            decoder_layerdrop=0.0,
            pad_token_id=1,
            bos_token_id=2,
            eos_token_id=2,
            decoder_start_token_id=3,
            suppress_tokens=None,
            begin_suppress_tokens=None,
            classifier_proj_size=8,
            num_labels=LABELS,
            attn_implementation="eager",
        )
    raise KeyError(family)


def tiny_model(class_name: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A tiny random model of `class_name` (a name of `CLASSES`), in eval mode."""
    torch.manual_seed(seed)
    config = tiny_config(family_of(class_name))
    if class_name.endswith("PreTraining"):
        config.mask_time_prob = 0.4  # creates `masked_spec_embed`; the masked frames are the inputs' own
    if class_name == "WhisperForAudioClassification":
        config.encoder_layers = 4  # the encoder alone: its 4 layers are the pipeline layers
    return getattr(transformers, class_name)(config).eval()


def _ctc_labels(batch: int, g: torch.Generator) -> torch.Tensor:
    labels = torch.randint(1, VOCAB, (batch, 6), generator=g)
    labels[1:, -2:] = -100  # shorter transcriptions are padded with -100
    return labels


def _pretraining_targets(batch: int, frames: int) -> dict[str, torch.Tensor]:
    """The masked frames and the sampled negatives `Wav2Vec2ForPreTraining` computes its loss on (as transformers'
    pre-training example builds them), drawn with a fixed seed. The negatives index the frames of their own block of
    `BATCH` rows (`_sample_negative_indices` offsets them by row within the batch it is given), so the rows may be
    split into micro-batches of `BATCH` rows, as a data collator draws them for each micro-batch."""
    import numpy as np
    from transformers.models.wav2vec2.modeling_wav2vec2 import _compute_mask_indices, _sample_negative_indices

    np.random.seed(0)
    masks, negatives = [], []
    for start in range(0, batch, BATCH):
        rows = min(BATCH, batch - start)
        mask = _compute_mask_indices((rows, frames), mask_prob=0.4, mask_length=2, min_masks=2)
        masks.append(mask)
        negatives.append(_sample_negative_indices((rows, frames), 4, mask_time_indices=mask))
    return {
        "mask_time_indices": torch.as_tensor(np.concatenate(masks), dtype=torch.bool),
        "sampled_negative_indices": torch.as_tensor(np.concatenate(negatives), dtype=torch.long),
    }


def tiny_inputs(class_name: str, batch: int = BATCH, seed: int = 1) -> dict[str, torch.Tensor]:
    """Inputs with labels for the class's loss (no labels for base models: the test reduces the output)."""
    g = torch.Generator().manual_seed(seed)
    family = family_of(class_name)
    if family == "convnext":
        inputs = {"pixel_values": torch.randn(batch, 3, IMAGE, IMAGE, generator=g)}
        if class_name.endswith("ImageClassification"):
            inputs["labels"] = torch.randint(0, LABELS, (batch,), generator=g)
        return inputs
    if family == "whisper":
        features = torch.randn(batch, MEL_BINS, MEL_FRAMES, generator=g)
        if class_name.endswith("AudioClassification"):
            return {"input_features": features, "labels": torch.randint(0, LABELS, (batch,), generator=g)}
        return {"input_features": features, "labels": torch.randint(4, WHISPER_VOCAB, (batch, 5), generator=g)}
    inputs = {"input_values": torch.randn(batch, AUDIO_SAMPLES, generator=g)}
    if class_name.endswith("ForCTC"):
        inputs["labels"] = _ctc_labels(batch, g)
    elif class_name.endswith("SequenceClassification"):
        inputs["labels"] = torch.randint(0, LABELS, (batch,), generator=g)
    elif class_name.endswith("PreTraining"):
        frames = int(tiny_model(class_name)._get_feat_extract_output_lengths(AUDIO_SAMPLES))
        inputs.update(_pretraining_targets(batch, frames))
    return inputs


def scalar_objective(outputs) -> torch.Tensor:
    """The loss, or for base models a fixed reduction of the hidden states, to compare gradients."""
    if getattr(outputs, "loss", None) is not None:
        return outputs.loss
    return outputs.last_hidden_state.pow(2).mean()


def save_tiny_whisper(path) -> str:
    """A folder with a tiny Whisper for speech recognition (2 + 2 layers, 16 mel bins, a 30 s window of 3,000
    frames), its feature extractor and a byte-level tokenizer of lower-case letters and Whisper's special tokens."""
    import json

    from transformers.convert_slow_tokenizer import bytes_to_unicode

    path.mkdir(parents=True, exist_ok=True)
    byte_chars = bytes_to_unicode()
    vocab = {"<|endoftext|>": 0, **{byte_chars[b]: i + 1 for i, b in enumerate(b" abcdefghijklmnopqrstuvwxyz'.,")}}
    (path / "vocab.json").write_text(json.dumps(vocab))
    (path / "merges.txt").write_text("#version: 0.2\n")
    eot = "<|endoftext|>"
    tokenizer = transformers.WhisperTokenizer(
        str(path / "vocab.json"), str(path / "merges.txt"), unk_token=eot, bos_token=eot, eos_token=eot, pad_token=eot
    )
    specials = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|translate|>", "<|notimestamps|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    config = tiny_config("whisper")
    config.update(
        {
            "vocab_size": len(tokenizer),
            "max_source_positions": 1500,
            "max_target_positions": 64,
            "pad_token_id": 0,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "decoder_start_token_id": tokenizer.convert_tokens_to_ids("<|startoftranscript|>"),
        }
    )
    torch.manual_seed(0)
    transformers.WhisperForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    transformers.WhisperFeatureExtractor(feature_size=MEL_BINS).save_pretrained(path)
    return str(path)


# The pipelines' tiny classifiers (tests/test_pipelines_vision_speech.py and tests/serving/test_pipeline_tasks.py): a
# ViT on 16 x 16 images, a Wav2Vec2 on raw audio (its convolutions sized for 8 kHz clips).
PIPELINE_WAV2VEC2 = {
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "intermediate_size": 37,
    "conv_dim": (16, 16),
    "conv_kernel": (10, 4),
    "conv_stride": (5, 4),
    "num_conv_pos_embeddings": 8,
    "num_conv_pos_embedding_groups": 2,
    "feat_extract_norm": "layer",
    "mask_time_prob": 0.0,
}


def save_vit_classifier(folder) -> str:
    """A tiny ViT image classifier of 3 labels (seeded) and its 16 x 16 image processor, saved in `folder`."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=37,
        num_labels=3,
    )
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    transformers.ViTImageProcessorPil(size={"height": 16, "width": 16}).save_pretrained(folder)
    return str(folder)
