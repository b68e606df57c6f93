"""Stage plans of the speech families: Wav2Vec2 and HuBERT (CTC, audio classification, pre-training), Whisper.

Wav2Vec2 and HuBERT: the convolutional feature encoder, its projection, the convolutional position embedding and
the encoder's input layer norm go with stage 0; the transformer layers (`encoder.layers`, `num_hidden_layers`)
are the pipeline layers; the CTC head, or the projector and classifier, with the last stage. Checkpoints with
`do_stable_layer_norm: true` (the "large-lv60" ones) apply `encoder.layer_norm` after the layers instead: one
process runs the stock forward either way.

`Wav2Vec2ForPreTraining` has a plan of its own. Its loss, on the last stage, reads the feature encoder's output
(`extract_features`, the quantizer's input) besides the last layer's. Only the hidden states travel between stages:
every stage holds and runs the feature encoder (`embeddings_feed_hidden_states_only=False`, as for the CTC head), so
the last stage computes `extract_features` again from the audio that every stage is fed, and the feature encoder's
gradients of the two paths (the transformer's on stage 0, the quantizer's on the last stage) are summed over the
stages as a tied embedding's are. The masked frames (`mask_time_indices`) and the sampled negatives
(`sampled_negative_indices`) must come with every batch (`process_stage_inputs`): drawn inside the forward, each
stage would draw its own. Stage 0 replaces the masked frames by `masked_spec_embed`; the last stage projects the
hidden states (`project_hid`), quantizes the features (the Gumbel noise is drawn there only), and computes the
contrastive and diversity loss, the model's own. With dropout and `mask_feature_prob` at 0 (the draws in the
forward then all happen on the last stage), the numbers are one process's
(`tests/distributed/test_speech_pretraining_stages.py`).

Whisper: the encoder's two convolutions and position table, and the token embedding (tied to `proj_out`), go with
stage 0; the encoder layers then the decoder layers are the pipeline layers (`encoder_layers + decoder_layers`),
the encoder's output travelling with every decoder stage, as T5's does. Its loss is not declared a vocabulary
loss: the chunked projection would build `decoder_input_ids` with `prepare_decoder_input_ids_from_labels`, which
Whisper lacks (it shifts its labels inside `forward`). `WhisperForAudioClassification` is the encoder alone (its
own `encoder`, no decoder) with a projector and classifier on the last stage: the encoder layers are its pipeline
layers. With `use_weighted_layer_sum` its head reads every layer's output, so its stages then run in one process
(`StagePlan.all_layer_outputs_flags`, the default of every plan, as for the Wav2Vec2 and HuBERT heads).
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

# Whisper's encoder and decoder layers: attention's (self and cross) q, k, v and fc1 column-wise, out_proj and fc2
# row-wise; `num_heads` divided, read where cross attention views its keys as (batch, -1, heads, head_dim).
_WHISPER_TP = {
    **{f"{attention}.{name}_proj": "colwise" for attention in ("self_attn", "encoder_attn") for name in "qkv"},
    "self_attn.out_proj": "rowwise",
    "encoder_attn.out_proj": "rowwise",
    "fc1": "colwise",
    "fc2": "rowwise",
}
_WHISPER_TP_DIVIDED = ("self_attn.num_heads", "encoder_attn.num_heads")

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
        process_stage_inputs=("mask_time_indices", "sampled_negative_indices"),
    ),
    StagePlan(
        family="hubert",
        classes=("HubertModel", *(f"Hubert{t}" for t in _CTC_AND_CLASSIFICATION)),
        **_WAV2VEC2_LIKE,
        # Optimum Graphcore's name in modeling_hubert.py (its hubert/__init__.py left it out)
        graphcore_aliases={"PipelinedHubertCTC": "HubertForCTC"},
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
        # Optimum Graphcore's torch log-mel feature extractor (and the processor using it) replaced transformers 4's
        # numpy one; transformers 5's `WhisperFeatureExtractor` computes with torch already (the same features).
        graphcore_extras={
            "WhisperProcessorTorch": "WhisperProcessor",
            "WhisperFeatureExtractorTorch": "WhisperFeatureExtractor",
        },
        graphcore_submodules=("feature_extraction_whisper", "processing_whisper"),
        tensor_parallel=_WHISPER_TP,
        tensor_parallel_divided=_WHISPER_TP_DIVIDED,
    ),
    StagePlan(
        family="whisper",
        classes=("WhisperForAudioClassification",),
        embeddings=("encoder.conv1", "encoder.conv2", "encoder.embed_positions"),
        layers=("encoder.layers",),
        layer_count_fields=("encoder_layers",),
        input_kind="audio",
        tensor_parallel=_WHISPER_TP,
        tensor_parallel_divided=_WHISPER_TP_DIVIDED,
    ),
)
