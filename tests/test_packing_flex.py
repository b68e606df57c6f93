"""Packed rows through `flex_attention`: a `BlockMask` made on the device from `packed_sequence_ids` gives the
numbers of the dense block-diagonal mask and of each feature run alone.

PyTorch 2.13 has no flex attention backward on CPU (eager or compiled), so on a CPU these tests check the mask,
the forward and `IPUTrainer`'s evaluation; gradients and a training step are checked on a CUDA device (`gpu`).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers
from torch.nn.attention.flex_attention import BlockMask, create_mask

from optimum_ipu.models.plans import position_offset
from optimum_ipu.packing import (
    PACKED_SEQUENCE_IDS,
    PackedDataCollator,
    check_packing_support,
    pack_features,
    packed_block_mask,
    packed_question_answering_loss,
    packing_attention,
    unpack_logits,
    with_packed_block_mask,
)

from .helpers import LENGTHS, MAX_LEN, assert_same_grads, feature_alone, packed_rows, packing_features, take_grads
from .tiny_models import VOCAB

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _flex_model(family: str = "Bert", seed: int = 0) -> transformers.PreTrainedModel:
    """A tiny random QA model (hidden 64, 2 layers) with flex attention; dropout off (flex attention has none)."""
    common = {"vocab_size": VOCAB, "num_labels": 2, "max_position_embeddings": 64}
    if family == "DistilBert":
        config = transformers.DistilBertConfig(
            dim=64, n_layers=2, n_heads=2, hidden_dim=37, dropout=0.0, attention_dropout=0.0, qa_dropout=0.0, **common
        )
    else:
        config = getattr(transformers, f"{family}Config")(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=37,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            **({"pad_token_id": 1} if family == "Roberta" else {}),
            **common,
        )
    torch.manual_seed(seed)
    model = transformers.AutoModelForQuestionAnswering.from_config(config, attn_implementation="flex_attention")
    assert model.config._attn_implementation == "flex_attention"
    return model.eval()


def _packed_qa(model: transformers.PreTrainedModel, attention: str) -> tuple[dict, dict, dict]:
    features = packing_features()
    packed = pack_features({k: v for k, v in features.items() if k != "labels"}, MAX_LEN)
    slots = max(map(len, packed["feature_index"]))
    collator = PackedDataCollator(MAX_LEN, slots, position_offset=position_offset(model.config), attention=attention)
    return features, packed, collator(packed_rows(packed))


@pytest.mark.parametrize("length", [64, 100, 384])
def test_block_mask_is_the_dense_mask(length):
    """3 sequences + padding (row 0) and 2 sequences filling the row (row 1): the BlockMask allows exactly the
    pairs the dense mask allows, and keeps exactly the 128 x 128 blocks that hold an allowed pair."""
    spans = [[length // 4, length // 3, length // 5], [length // 2, length - length // 2]]
    rows = [
        {"input_ids": [5] * sum(s), "token_type_ids": [0] * sum(s), "position_ids": [p for n in s for p in range(n)]}
        for s in spans
    ]
    dense = PackedDataCollator(length, 3)(rows)["attention_mask"][:, 0] == 0  # True where attention is allowed
    batch = PackedDataCollator(length, 3, attention="flex")(rows)
    assert "attention_mask" not in batch and batch[PACKED_SEQUENCE_IDS].dtype == torch.long
    pad = length - sum(spans[0])
    assert (
        batch[PACKED_SEQUENCE_IDS][0].tolist() == [j + 1 for j, n in enumerate(spans[0]) for _ in range(n)] + [0] * pad
    )
    assert batch[PACKED_SEQUENCE_IDS][1].tolist() == [1] * spans[1][0] + [2] * spans[1][1]

    block_mask = packed_block_mask(batch[PACKED_SEQUENCE_IDS])
    assert isinstance(block_mask, BlockMask) and block_mask.shape == (2, 1, length, length)
    assert block_mask.BLOCK_SIZE == (128, 128)
    pairs = create_mask(block_mask.mask_mod, 2, 1, length, length, device="cpu")[:, 0]
    assert torch.equal(pairs, dense)
    blocks = math.ceil(length / 128)
    padded = torch.zeros(2, blocks * 128, blocks * 128, dtype=torch.bool)
    padded[:, :length, :length] = dense
    kept = padded.reshape(2, blocks, 128, blocks, 128).any(dim=(2, 4))
    assert torch.equal(block_mask.to_dense()[:, 0].bool(), kept)
    if length == 384:  # the blocks between the first and the last sequence are skipped
        assert not kept[0, 0, 2] and not kept[0, 2, 0] and kept.sum() < 2 * blocks**2


@pytest.mark.parametrize("family", ["Bert", "Roberta", "DistilBert"])
def test_flex_packed_forward_equals_each_feature_alone(family):
    model = _flex_model(family)
    check_packing_support(model)
    assert packing_attention(model) == "flex"
    features, packed, batch = _packed_qa(model, "flex")
    batch.pop("labels")
    inputs = with_packed_block_mask(batch)
    assert isinstance(inputs["attention_mask"], BlockMask) and PACKED_SEQUENCE_IDS not in inputs
    with torch.no_grad():
        out = model(**inputs)  # transformers compiles flex_attention: on a CPU, forward only
    start, end = unpack_logits(out.start_logits, packed), unpack_logits(out.end_logits, packed)
    model.set_attn_implementation("sdpa")  # each feature alone, with the same weights
    with torch.no_grad():
        for i in range(len(LENGTHS)):
            alone = model(**feature_alone(features, i))
            torch.testing.assert_close(start[i], alone.start_logits[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(end[i], alone.end_logits[0], atol=1e-5, rtol=0)


def _trainer(model, batch_size: int, output_dir, attention: str, **args):
    import datasets

    from optimum_ipu import IPUConfig
    from optimum_ipu.trainer import IPUTrainer, IPUTrainingArguments

    _, packed, _ = _packed_qa(model, attention)
    slots = max(map(len, packed["feature_index"]))
    training_args = IPUTrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size,
        label_names=["labels"],
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **args,
    )
    trainer = IPUTrainer(
        model=model,
        ipu_config=IPUConfig(),
        args=training_args,
        train_dataset=datasets.Dataset.from_dict(packed),
        data_collator=PackedDataCollator(MAX_LEN, slots, attention=attention),
        compute_loss_func=packed_question_answering_loss,
    )
    return trainer, datasets.Dataset.from_dict(packed)


def test_ipu_trainer_evaluates_flex_packed_rows_as_the_dense_mask(tmp_path):
    """`IPUTrainer._prepare_inputs` turns `packed_sequence_ids` into a BlockMask on the device; evaluation (the
    forward through `prediction_step`) gives the loss and logits of the same weights with sdpa and a dense mask."""
    flex = _flex_model()
    dense = copy.deepcopy(flex)
    dense.set_attn_implementation("sdpa")
    rows = len(pack_features({"input_ids": packing_features()["input_ids"]}, MAX_LEN)["input_ids"])
    results = {}
    for name, model in (("flex", flex), ("dense", dense)):
        trainer, dataset = _trainer(model, rows, tmp_path / name, name)
        if name == "flex":
            prepared = trainer._prepare_inputs(trainer.data_collator(list(dataset)))
            assert isinstance(prepared["attention_mask"], BlockMask) and PACKED_SEQUENCE_IDS not in prepared
            assert prepared["attention_mask"].kv_num_blocks.device.type == trainer.args.device.type
        results[name] = trainer.predict(dataset)
    assert math.isfinite(results["flex"].metrics["test_loss"])
    torch.testing.assert_close(
        results["flex"].metrics["test_loss"], results["dense"].metrics["test_loss"], atol=1e-5, rtol=0
    )
    for flex_logits, dense_logits in zip(results["flex"].predictions, results["dense"].predictions, strict=True):
        torch.testing.assert_close(torch.as_tensor(flex_logits), torch.as_tensor(dense_logits), atol=1e-5, rtol=0)


def test_flex_packing_rejects_bad_input_with_a_clear_error():
    with pytest.raises(ValueError, match="attention: got 'block'; expected 'dense'"):
        PackedDataCollator(8, 2, attention="block")
    with pytest.raises(ValueError, match=r"sequence_ids has shape \(8,\); expected \(batch, seq\)"):
        packed_block_mask(torch.zeros(8, dtype=torch.long))
    model = _flex_model()
    model.config.attention_probs_dropout_prob = 0.1
    with pytest.raises(ValueError, match="flex_attention' with attention_probs_dropout_prob=0.1; flex attention has"):
        check_packing_support(model)
    check_packing_support(model, training=False)  # evaluation runs without dropout
    with pytest.raises(ValueError, match=r"PackedDataCollator\(attention='dense'\) for BertForQuestionAnswering with"):
        check_packing_support(model, training=False, attention="dense")  # crashes compiled CPU flex: refused
    check_packing_support(model, training=False, attention="flex")
    model.config._attn_implementation = "flash_attention_2"  # only the name is read: no kernel is loaded
    with pytest.raises(ValueError, match="flash attention kernels take a 2-D padding mask only"):
        check_packing_support(model)
    assert packing_attention(model) == "dense" and packing_attention(_flex_model()) == "flex"
    unchanged = {"input_ids": torch.ones(1, 4, dtype=torch.long)}
    assert with_packed_block_mask(unchanged) is unchanged  # unpacked (evaluation) batches pass through


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("family", ["Bert", "DistilBert"])
def test_flex_packed_gradients_equal_each_feature_alone_on_gpu(family):
    model = _flex_model(family).cuda().train()
    features, packed, batch = _packed_qa(model, "flex")
    labels = batch.pop("labels").cuda()
    out = model(**with_packed_block_mask({k: v.cuda() for k, v in batch.items()}))
    start = unpack_logits(out.start_logits.detach().cpu(), packed)
    (packed_question_answering_loss(out, labels) * len(LENGTHS)).backward()
    packed_grads = take_grads(model)

    model.set_attn_implementation("sdpa")  # each feature alone with the same weights (one compile per length else)
    total = 0.0
    for i in range(len(LENGTHS)):
        inputs = {k: v.cuda() for k, v in feature_alone(features, i).items()}
        positions = {k: torch.tensor([features[k][i]], device="cuda") for k in ("start_positions", "end_positions")}
        alone = model(**inputs, **positions)
        torch.testing.assert_close(start[i], alone.start_logits[0].detach().cpu(), atol=1e-5, rtol=0)
        total = total + alone.loss
    total.backward()
    assert_same_grads(packed_grads, take_grads(model))


@pytest.mark.gpu
@needs_gpu
def test_ipu_trainer_step_with_flex_equals_the_dense_mask_on_gpu(tmp_path):
    """One training step of packed rows: a flex model (BlockMask made by the trainer on the GPU) and the same
    weights with sdpa and the dense mask give the same loss and the same updated weights (fp32). SGD with a
    learning rate of 1 makes the update the (clipped) gradient itself: Adam's first step, `lr * g / |g|`, would
    amplify rounding on weights whose gradient is near 0."""
    flex = _flex_model()
    dense = copy.deepcopy(flex)
    dense.set_attn_implementation("sdpa")
    rows = len(pack_features({"input_ids": packing_features()["input_ids"]}, MAX_LEN)["input_ids"])
    initial = {k: v.detach().float().cpu().clone() for k, v in flex.state_dict().items()}
    losses, weights = {}, {}
    for name, model in (("flex", flex), ("dense", dense)):
        trainer, _ = _trainer(
            model,
            rows,
            tmp_path / name,
            name,
            max_steps=1,
            fp32=True,
            optim="sgd",
            learning_rate=1.0,
            lr_scheduler_type="constant",
        )
        assert trainer.args.device.type == "cuda"
        losses[name] = trainer.train().training_loss
        weights[name] = {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
    assert math.isfinite(losses["flex"]) and losses["flex"] > 0
    assert abs(losses["flex"] - losses["dense"]) < 1e-5, losses
    for key, value in weights["flex"].items():
        torch.testing.assert_close(value, weights["dense"][key], atol=1e-5, rtol=1e-4, msg=key)
    assert (weights["flex"]["qa_outputs.weight"] - initial["qa_outputs.weight"]).abs().max() > 1e-3  # it stepped
