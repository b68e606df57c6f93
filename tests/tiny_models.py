"""Tiny random-weight models of every registered class, with inputs and labels, for CPU tests.

Dropout is off so two runs of the same model give the same numbers. Every family has 4 pipeline layers
(T5: 2 encoder + 2 decoder blocks), so the same layouts apply to all.
"""

from __future__ import annotations

import torch
import transformers
from optimum_ipu.models.groupbert import GroupBertConfig

from optimum_ipu.models.pipelined_classes import transformers_class
from optimum_ipu.models.plans import plan_for_class

VOCAB, SEQ, BATCH, CHOICES, LABELS = 99, 8, 2, 3, 3


def tiny_config(family: str) -> transformers.PretrainedConfig:
    common = {"vocab_size": VOCAB, "num_labels": LABELS, "attn_implementation": "eager"}
    bert_like = {
        "hidden_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "intermediate_size": 37,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": 64,
    }
    if family == "bert":
        return transformers.BertConfig(**bert_like, **common)
    if family == "groupbert":  # 2 convolution groups of 16 channels, 4 feed-forward groups of 9 and 8
        return GroupBertConfig(
            **{**bert_like, "intermediate_size": 36}, ffn_groups=4, conv_group_size=16, conv_kernel_size=3, **common
        )
    if family == "roberta":
        return transformers.RobertaConfig(**bert_like, pad_token_id=1, **common)
    if family == "distilbert":
        return transformers.DistilBertConfig(
            dim=32,
            n_layers=4,
            n_heads=2,
            hidden_dim=37,
            dropout=0.0,
            attention_dropout=0.0,
            qa_dropout=0.0,
            seq_classif_dropout=0.0,
            **common,
        )
    if family == "gpt2":
        return transformers.GPT2Config(
            n_embd=32,
            n_layer=4,
            n_head=2,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            classifier_dropout=0.0,
            pad_token_id=0,
            **common,
        )
    if family == "t5":
        return transformers.T5Config(
            d_model=32,
            d_kv=16,
            d_ff=37,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=2,
            dropout_rate=0.0,
            decoder_start_token_id=0,
            pad_token_id=0,
            **common,
        )
    if family in ("deberta", "deberta-v2", "mpnet"):
        config_class = {"deberta": transformers.DebertaConfig, "deberta-v2": transformers.DebertaV2Config}
        extra = {"relative_attention": True, "max_relative_positions": 16, "pos_att_type": ["c2p", "p2c"]}
        if family == "mpnet":
            config_class, extra = {"mpnet": transformers.MPNetConfig}, {}
        return config_class[family](**bert_like, pad_token_id=1, **extra, **common)
    if family == "lxmert":
        return transformers.LxmertConfig(
            hidden_size=32,
            num_attention_heads=2,
            intermediate_size=37,
            l_layers=4,
            r_layers=1,
            x_layers=1,
            visual_feat_dim=8,
            visual_pos_dim=4,
            num_qa_labels=LABELS,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            max_position_embeddings=64,
            **common,
        )
    if family in ("llama", "mistral", "qwen2"):
        config_class = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig}
        config_class["qwen2"] = transformers.Qwen2Config
        return config_class[family](
            hidden_size=32,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=37,
            max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            **common,
        )
    if family == "bart":
        return transformers.BartConfig(
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            max_position_embeddings=64,
            dropout=0.0,
            attention_dropout=0.0,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=2,
            forced_eos_token_id=None,
            **common,
        )
    if family == "mt5":
        return transformers.MT5Config(
            d_model=32,
            d_kv=16,
            d_ff=37,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=2,
            dropout_rate=0.0,
            decoder_start_token_id=0,
            pad_token_id=0,
            **common,
        )
    if family == "vit":
        common.pop("vocab_size")
        return transformers.ViTConfig(
            image_size=16,
            patch_size=4,
            num_channels=3,
            **{k: v for k, v in bert_like.items() if "max_pos" not in k},
            **common,
        )
    raise KeyError(family)


def tiny_model(class_name: str, seed: int = 0) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    config = tiny_config(plan_for_class(class_name).family)
    if class_name.endswith("QuestionAnswering") and not class_name.startswith("Lxmert"):
        config.num_labels = 2  # start and end logits
    if class_name.startswith(("T5Encoder", "MT5Encoder")) or class_name.endswith("5ForTokenClassification"):
        config.num_layers = 4  # an encoder alone: 4 layers, as every other tiny model
    return transformers_class(class_name)(config).eval()


def tiny_inputs(class_name: str, batch: int = BATCH, seed: int = 1) -> dict[str, torch.Tensor]:
    """Inputs with labels for the class's loss (no labels for base models: the test reduces the output)."""
    g = torch.Generator().manual_seed(seed)
    if class_name.startswith("ViT"):
        inputs = {"pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}
        if class_name.endswith("ImageClassification"):
            inputs["labels"] = torch.randint(0, LABELS, (batch,), generator=g)
        return inputs
    shape = (batch, CHOICES, SEQ) if class_name.endswith("MultipleChoice") else (batch, SEQ)
    ids = torch.randint(3, VOCAB, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., -2:] = 0  # some padding, so attention masks matter
    if class_name.startswith("Bart"):
        ids[..., -3] = 2  # one </s> a row: BART's classification head pools there
    if class_name.startswith(("T5For", "MT5For")) and class_name.endswith("SequenceClassification"):
        ids[..., -3] = 1  # T5's head pools at </s> likewise
    inputs = {"input_ids": ids, "attention_mask": mask}
    if class_name.startswith("Lxmert"):
        inputs["visual_feats"] = torch.randn(batch, 3, 8, generator=g)
        inputs["visual_pos"] = torch.rand(batch, 3, 4, generator=g)
        if class_name.endswith("QuestionAnswering"):
            inputs["labels"] = torch.randint(0, LABELS, (batch,), generator=g)
        return inputs
    if class_name.endswith(("MaskedLM", "TokenClassification", "PreTraining")):
        high = LABELS if class_name.endswith("TokenClassification") else VOCAB
        labels = torch.randint(0, high, shape, generator=g)
        labels[..., -2:] = -100
        inputs["labels"] = labels
    if class_name.endswith("PreTraining"):
        inputs["next_sentence_label"] = torch.randint(0, 2, (batch,), generator=g)
    if class_name.endswith(("SequenceClassification", "MultipleChoice")):
        inputs["labels"] = torch.randint(0, LABELS if "Sequence" in class_name else CHOICES, (batch,), generator=g)
    if class_name in ("T5Model", "MT5Model"):
        inputs["decoder_input_ids"] = torch.randint(2, VOCAB, (batch, 5), generator=g)
    if class_name.endswith("QuestionAnswering"):
        inputs["start_positions"] = torch.randint(0, SEQ - 2, (batch,), generator=g)
        inputs["end_positions"] = torch.randint(0, SEQ - 2, (batch,), generator=g)
    if class_name.endswith(("LMHeadModel", "ForCausalLM")):
        inputs["labels"] = ids.masked_fill(mask == 0, -100)
    if class_name.endswith("ForConditionalGeneration"):
        inputs["labels"] = torch.randint(3, VOCAB, (batch, 5), generator=g)
    return inputs


def scalar_objective(outputs) -> torch.Tensor:
    """The loss, or for base models a fixed reduction of the hidden states, to compare gradients."""
    if getattr(outputs, "loss", None) is not None:
        return outputs.loss
    return outputs[0].pow(2).mean()  # last_hidden_state (LXMERT: language_output)
