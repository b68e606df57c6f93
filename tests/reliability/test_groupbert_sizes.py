"""GroupBERT's sizes are bounded before anything is allocated (issue 42, item 9): `conv_kernel_size` 99,999,999 asked
for terabytes, -3 failed inside torch, `conv_group_size` 0 divided by zero. The config refuses them when made and the
model again when built, since `--config_overrides` (`update_from_string`) sets fields after the config's `__init__`."""

from __future__ import annotations

import pytest
from optimum_ipu.models.groupbert import GroupBertConfig, GroupBertForPreTraining

SMALL = {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 48}

BAD_SIZES = [
    ("conv_kernel_size", 99_999_999, "conv_kernel_size 99999999 is wider than any sequence"),
    ("conv_kernel_size", 97, "conv_kernel_size 97 is wider than any sequence of max_position_embeddings 48 reaches"),
    ("conv_kernel_size", -3, "conv_kernel_size -3 must be a whole number >= 1"),
    ("conv_kernel_size", 0, "conv_kernel_size 0 must be a whole number >= 1"),
    ("conv_kernel_size", 2.5, "conv_kernel_size 2.5 must be a whole number >= 1"),
    ("conv_group_size", 0, "conv_group_size 0 must be a whole number >= 1"),
    ("conv_group_size", -16, "conv_group_size -16 must be a whole number >= 1"),
    ("conv_group_size", 12, "hidden_size 32 must divide by conv_group_size 12"),
    ("ffn_groups", 0, "ffn_groups 0 must be a whole number >= 1"),
    ("ffn_groups", True, "ffn_groups True must be a whole number >= 1"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD_SIZES, ids=[f"{f}={v}" for f, v, _ in BAD_SIZES])
def test_a_bad_size_is_refused_when_made_and_when_overridden(field, value, message, reliability):
    reliability.expect_clear_error(lambda: GroupBertConfig(**SMALL, **{field: value}), message)
    config = GroupBertConfig(**SMALL)
    setattr(config, field, value)  # what --config_overrides does, after __init__
    reliability.expect_clear_error(lambda: GroupBertForPreTraining(config), message)


def test_the_widest_useful_kernel_builds():
    config = GroupBertConfig(**SMALL, conv_kernel_size=95, conv_group_size=32)  # 2 x 48 - 1
    model = GroupBertForPreTraining(config)
    assert model.bert.encoder.layer[0].convolution.groupconv.kernel_size == (95,)
