"""The pure parts of the forward pipeline over processes (`optimum_ipu.runtime.stages.forward`): the header that
describes what travels between stages, and a batch split into micro-batches and merged back as one forward gives it.
(The processes themselves: tests/distributed/test_stage_loading.py and tests/distributed/test_generation_stages.py.)"""

from __future__ import annotations

import pytest
import torch
import transformers

from optimum_ipu.runtime.stages.forward import labelled_items, merge_outputs, split_rows
from optimum_ipu.runtime.stages.shapes import decode_shapes, encode_shapes


def test_the_header_describes_every_tensor_that_travels():
    tensors = (torch.zeros(3, 7, 16, dtype=torch.bfloat16), torch.zeros(3, 5, dtype=torch.int64), torch.zeros(()))
    header = encode_shapes(tensors, torch.device("cpu"))
    assert header.dtype == torch.int64 and header.dim() == 1
    assert decode_shapes(header) == [(t.dtype, tuple(t.shape)) for t in tensors]
    with pytest.raises(ValueError, match="cannot describe"):
        encode_shapes((torch.zeros(1, dtype=torch.complex64),), torch.device("cpu"))


def test_a_batch_split_into_micro_batches_keeps_its_rows_in_order():
    batch = {"input_ids": torch.arange(10).reshape(5, 2), "labels": torch.arange(5), "mask_row": torch.ones(2), "n": 3}
    parts = split_rows(batch, 2)
    assert [len(p["input_ids"]) for p in parts] == [3, 2]
    assert torch.equal(torch.cat([p["input_ids"] for p in parts]), batch["input_ids"])
    assert all(p["mask_row"] is batch["mask_row"] and p["n"] == 3 for p in parts)  # not the batch's rows: whole
    assert len(split_rows(batch, 8)) == 5  # never more micro-batches than rows


def test_merged_micro_batch_outputs_equal_one_forward_of_the_batch():
    """A causal LM's loss is a mean over the shifted labelled tokens: the micro-batches' losses weighted by their
    items give the whole batch's loss, and the logits are the rows concatenated."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4
    )
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 64, (5, 9))
    labels = ids.clone()
    labels[0, 4:] = -100  # uneven labelled tokens per row
    labels[3, 1:] = -100
    batch = {"input_ids": ids, "labels": labels}
    with torch.no_grad():
        whole = model(**batch, use_cache=False)
        parts = split_rows(batch, 3)
        outputs = [model(**part, use_cache=False) for part in parts]
    merged = merge_outputs(outputs, [labelled_items(part, shifts_labels=True) for part in parts])
    torch.testing.assert_close(merged.logits, whole.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(merged.loss, whole.loss, atol=1e-6, rtol=1e-6)
    # unweighted, the mean of the means is another number: the weights are what make it equal
    assert abs(torch.stack([o.loss for o in outputs]).mean() - whole.loss) > 1e-3
    # the loss one forward gives when Trainer passes a count of the batch's items (its token sum over that count)
    count = torch.tensor(40)
    with torch.no_grad():
        counted = model(**batch, use_cache=False, num_items_in_batch=count)
    items = [labelled_items(part, shifts_labels=True) for part in parts]
    torch.testing.assert_close(merge_outputs(outputs, items, total=40.0).loss, counted.loss, atol=1e-6, rtol=1e-6)


def test_merged_class_losses_are_the_mean_over_the_rows():
    """A classifier's loss is a mean over its rows, whatever count a caller passes: the micro-batches' means, weighted
    by their rows, give the batch's."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, num_labels=3
    )
    model = transformers.BertForSequenceClassification(config).eval()
    batch = {"input_ids": torch.randint(1, 64, (7, 6)), "labels": torch.tensor([0, 1, 2, 1, 0, 2, 2])}
    with torch.no_grad():
        whole = model(**batch)
        parts = split_rows(batch, 3)
        outputs = [model(**part) for part in parts]
    items = [labelled_items(part, shifts_labels=False) for part in parts]
    assert items == [3, 2, 2]
    torch.testing.assert_close(merge_outputs(outputs, items, total=7.0).loss, whole.loss, atol=1e-6, rtol=1e-6)


def test_split_rows_by_rows_per_part_gives_one_process_batches():
    """A host call of several per-device batches is cut back into them (the last one shorter), whatever `parts`."""
    batch = {"input_ids": torch.arange(40).view(20, 2), "labels": torch.arange(20), "scale": torch.tensor(2.0)}
    parts = split_rows(batch, 8, rows_per_part=8)
    assert [p["input_ids"].shape[0] for p in parts] == [8, 8, 4]
    assert torch.equal(torch.cat([p["labels"] for p in parts]), batch["labels"])
    assert all(p["scale"] is batch["scale"] for p in parts)  # not a row tensor: whole in every part
    assert [p["labels"].shape[0] for p in split_rows(batch, 8, rows_per_part=32)] == [20]
