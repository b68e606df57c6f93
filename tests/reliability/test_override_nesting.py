"""A deeply nested `--ipu_config_overrides` value is one error naming the field, not a `RecursionError` traceback
(issue 28, item 4); brackets inside strings do not count, and what fields take still parses."""

from __future__ import annotations

import pytest

from optimum_ipu import IPUConfig
from optimum_ipu.errors import IncompatibleIPUConfigError

from .test_script_errors import QA_DIR, load_script, one_clear_line, qa_argv, run_main


@pytest.mark.parametrize("depth", [9, 1_000, 200_000])
@pytest.mark.parametrize(
    ("field", "open_", "close"),
    [("layers_per_ipu", "[", "]"), ("parallelize_kwargs", '{"a":', "}"), ("inference_layers_per_ipu", "[{", "}]")],
)
def test_a_depth_bomb_is_one_error_naming_the_field(reliability, depth, field, open_, close):
    update = f"{field}={open_ * depth}{close * depth}"
    reliability.expect_clear_error(
        lambda: IPUConfig().update_from_string(update), (f"`{field}`", "levels deep"), (IncompatibleIPUConfigError,)
    )


def test_brackets_in_strings_and_shallow_values_still_parse():
    config = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2)
    config.update_from_string('layers_per_ipu=[1 3],parallelize_kwargs={"note": "[[[[[[[[[[[[[[[["}')
    assert config.layers_per_ipu == [1, 3] and config.parallelize_kwargs == {"note": "[[[[[[[[[[[[[[[["}


def test_a_script_given_a_depth_bomb_ends_in_one_line(tmp_path, reliability):
    run_qa = load_script(QA_DIR, "run_qa")
    argv = qa_argv(tmp_path, "--ipu_config_overrides", "layers_per_ipu=" + "[" * 50_000 + "]" * 50_000)
    code, stderr = run_main(run_qa, argv)
    one_clear_line(reliability, code, stderr, ("`layers_per_ipu`", "levels deep"))
