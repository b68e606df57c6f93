"""Stage plans of the speech families: Wav2Vec2 and HuBERT (CTC, audio classification, pre-training), Whisper.

Wav2Vec2 and HuBERT: the convolutional feature encoder, its projection, the convolutional position embedding and
the encoder's input layer norm go with stage 0; the transformer layers (`encoder.layers`, `num_hidden_layers`)
are the pipeline layers; the CTC head, or the projector and classifier, with the last stage. Checkpoints with
`do_stable_layer_norm: true` (the "large-lv60" ones) apply `encoder.layer_norm` after the layers instead: one
process runs the stock forward either way. `Wav2Vec2ForPreTraining` has a plan of its own: its loss on the last
stage reads the feature encoder's output (stage 0) besides the last layer's, so its stages run in one process.

Whisper: the encoder's two convolutions and position table, and the token embedding (tied to `proj_out`), go with
stage 0; the encoder layers then the decoder layers are the pipeline layers (`encoder_layers + decoder_layers`),
the encoder's output travelling with every decoder stage, as T5's does. Its loss is not declared a vocabulary
loss: the chunked projection would build `decoder_input_ids` with `prepare_decoder_input_ids_from_labels`, which
Whisper lacks (it shifts its labels inside `forward`). `WhisperForAudioClassification` is the encoder alone (its
own `encoder`, no decoder) with a projector and classifier on the last stage: the encoder layers are its pipeline
layers. With `use_weighted_layer_sum` its head reads every layer's output, so its stages then run in one process.
"""

from __future__ import annotations

from ..stage_plan import StagePlan

_CTC_AND_CLASSIFICATION = ("ForCTC", "ForSequenceClassification")
_WAV2VEC2_EMBEDDINGS = ("feature_extractor", "feature_projection", "encoder.pos_conv_embed", "encoder.layer_norm")
_WAV2VEC2_LIKE = {
    "embeddings": _WAV2VEC2_EMBEDDINGS,
    "layers": ("encoder.layers",),
    "input_kind": "audio",
    "embeddings_feed_hidden_states_only": False,  # the output carries the feature encoder's (extract_features)
}

PLANS: tuple[StagePlan, ...] = (
    StagePlan(
        family="wav2vec2",
        classes=("Wav2Vec2Model", *(f"Wav2Vec2{t}" for t in _CTC_AND_CLASSIFICATION)),
        **_WAV2VEC2_LIKE,
    ),
    StagePlan(
        family="wav2vec2",
        classes=("Wav2Vec2ForPreTraining",),
        **_WAV2VEC2_LIKE,
        process_stages=False,
        process_stages_reason=(
            "its contrastive loss on the last stage reads the feature encoder's output of stage 0 and draws the "
            "masked frames there"
        ),
    ),
    StagePlan(
        family="hubert",
        classes=("HubertModel", *(f"Hubert{t}" for t in _CTC_AND_CLASSIFICATION)),
        **_WAV2VEC2_LIKE,
    ),
    StagePlan(
        family="whisper",
        classes=("WhisperForConditionalGeneration",),
        embeddings=(
            "encoder.conv1",
            "encoder.conv2",
            "encoder.embed_positions",
            "decoder.embed_tokens",
            "decoder.embed_positions",
        ),
        layers=("encoder.layers", "decoder.layers"),
        layer_count_fields=("encoder_layers", "decoder_layers"),
        encoder="encoder",
        input_kind="audio",
    ),
    StagePlan(
        family="whisper",
        classes=("WhisperForAudioClassification",),
        embeddings=("encoder.conv1", "encoder.conv2", "encoder.embed_positions"),
        layers=("encoder.layers",),
        layer_count_fields=("encoder_layers",),
        input_kind="audio",
    ),
)
