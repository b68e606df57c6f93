"""Bad training arguments and argument combinations through `IPUTrainingArguments` and `IPUTrainer`: one clear
`ValueError` naming the flag or the field, raised before any training starts."""

from __future__ import annotations

import contextlib
import io

import datasets
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import HfArgumentParser

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig, IPUTrainer, IPUTrainingArguments

from ..tiny_models import tiny_inputs, tiny_model

CLASS = "BertForSequenceClassification"  # 4 layers


def arguments(out, **kwargs) -> IPUTrainingArguments:
    return IPUTrainingArguments(output_dir=str(out), report_to=[], **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        (
            {"n_ipu": 3, "ipu_config_overrides": "layers_per_ipu=[2 2],ipus_per_replica=2"},
            ("--n_ipu 3", "`ipus_per_replica` 2"),
        ),
        ({"n_ipu": -4}, ("--n_ipu", "-4")),
        ({"ipu_config_overrides": "gradient_acumulation_steps=4"}, ("`gradient_acumulation_steps`",)),
        ({"ipu_config_overrides": "layers_per_ipu=[2 2],ipus_per_replica=3"}, ("`layers_per_ipu`",)),
        ({"ipu_config_overrides": "device_iterations=-1"}, ("`device_iterations`", "-1")),
        ({"ipu_config_overrides": 5}, ("IPUConfig update", "int 5")),
        ({"ipu_config_name": "Graphcore/no-such-ipu"}, ("'Graphcore/no-such-ipu'",)),
        ({"loss_scaling": -1.0}, ("--loss_scaling", "-1.0")),
        ({"loss_scaling": 0.0}, ("--loss_scaling",)),
        ({"pipeline_schedule": "zigzag"}, ("--pipeline_schedule", "'zigzag'")),
        ({"dataloader_mode": "turbo"}, ("--dataloader_mode", "'turbo'")),
        ({"fp32": True, "fp16": True}, ("--fp32", "--fp16")),
        ({"warmup_ratio": -0.5}, ("--warmup_ratio", "-0.5")),
    ],
)
def test_bad_training_arguments_name_the_flag(tmp_path, reliability, kwargs, names):
    reliability.expect_clear_error(lambda: arguments(tmp_path, **kwargs).load_ipu_config(), names)


def test_broken_config_file_named_by_the_arguments(tmp_path, reliability):
    (tmp_path / "ipu_config.json").write_text('{"layers_per_ipu": [1, 1],\n "seed": }')
    reliability.expect_clear_error(
        lambda: arguments(tmp_path / "out", ipu_config_name=str(tmp_path)).load_ipu_config(),
        ("ipu_config.json", "line 2 column 10"),
    )


@settings(max_examples=25, deadline=None)
@given(
    flag=st.sampled_from(["--n_ipu", "--loss_scaling", "--warmup_ratio"]),
    value=st.sampled_from(["four", "1,5", "[1]", ""]),
)
def test_command_line_wrong_types_name_the_flag(flag, value, reliability):
    """From the command line (the example scripts' `HfArgumentParser`), a value of the wrong type is argparse's
    usage error: exit code 2 and a message naming the flag and the value."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        HfArgumentParser(IPUTrainingArguments).parse_args_into_dataclasses(["--output_dir", "o", flag, value])
    last = err.getvalue().strip().splitlines()[-1]
    assert reliability.bad_input(exit_.value.code == 2 and flag in last and repr(value) in last), err.getvalue()


@pytest.mark.parametrize(
    ("config", "names"),
    [
        (IPUConfig(layers_per_ipu=[1, 2]), ("`layers_per_ipu`", "model has 4")),
        # more than the model has is taken in order (Optimum Graphcore's rule) unless a slot would get no layer
        (IPUConfig(layers_per_ipu=[4, 1]), ("`layers_per_ipu`", "model has 4")),
        (IPUConfig(layers_per_ipu=[1, 1, 1, 1, 1]), ("`layers_per_ipu`", "model has 4")),
        (IPUConfig(layers_per_ipu=[5, -1]), ("`layers_per_ipu`", "only 4")),
        (IPUConfig(inference_layers_per_ipu=[3, 0]), ("`inference_layers_per_ipu`", "model has 4")),
    ],
    ids=["sum-short", "sum-long-slot-empty", "sum-long", "explicit-too-many", "inference"],
)
def test_layer_counts_that_do_not_match_the_model(tmp_path, reliability, config, names):
    """Checked when the trainer is built, for training and inference layouts alike: not in the middle of a run."""
    model = tiny_model(CLASS)
    reliability.expect_clear_error(
        lambda: IPUTrainer(model, config, arguments(tmp_path)), names, (IncompatibleIPUConfigError,)
    )


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"n_ipu": "4"}, ("--n_ipu", "'4'")),
        ({"loss_scaling": "64"}, ("--loss_scaling", "'64'")),
    ],
)
def test_python_values_of_the_wrong_type_name_the_flag(tmp_path, reliability, kwargs, names):
    reliability.expect_clear_error(lambda: arguments(tmp_path, **kwargs).load_ipu_config(), names)


# Integers transformers does not check: 0 accumulation steps was a ZeroDivisionError mid-run, -2 trained zero steps
# and saved a config that `config check` then rejected. (flag, lowest valid value)
COUNT_FLAGS = {
    "gradient_accumulation_steps": 1,
    "per_device_train_batch_size": 1,
    "per_device_eval_batch_size": 1,
    "ddp_timeout": 1,
    "max_consecutive_skipped_steps": 0,
}


@settings(max_examples=40, deadline=None)
@given(flag=st.sampled_from(sorted(COUNT_FLAGS)), data=st.data(), route=st.sampled_from(["python", "command line"]))
def test_counts_below_their_minimum_name_the_flag(flag, data, route, reliability):
    value = data.draw(st.integers(-(10**6), COUNT_FLAGS[flag] - 1), label="value")
    if route == "python":
        call = lambda: IPUTrainingArguments(output_dir="o", report_to=[], **{flag: value})  # noqa: E731
    else:
        argv = ["--output_dir", "o", f"--{flag}={value}"]
        call = lambda: HfArgumentParser(IPUTrainingArguments).parse_args_into_dataclasses(argv)  # noqa: E731
    reliability.expect_clear_error(call, (f"--{flag}", str(value)))


def test_accumulation_override_goes_through_the_config_validation(tmp_path, reliability):
    """`--gradient_accumulation_steps` overrides the config's, with the config's checks (here: its upper bound)."""
    args = arguments(tmp_path, gradient_accumulation_steps=3)
    assert args.load_ipu_config(IPUConfig(gradient_accumulation_steps=2)).gradient_accumulation_steps == 3
    args = arguments(tmp_path, gradient_accumulation_steps=2**21)
    reliability.expect_clear_error(lambda: args.load_ipu_config(), "`gradient_accumulation_steps`")


@pytest.mark.parametrize(("rows", "micro", "accumulation"), [(4, 8, 1), (6, 2, 8), (1, 2, 1)])
def test_a_batch_larger_than_the_data_set_is_one_clear_error(tmp_path, rows, micro, accumulation, reliability):
    """transformers failed saying only that max_steps must be positive."""
    data = tiny_inputs(CLASS, batch=rows, seed=0)
    train = datasets.Dataset.from_dict({k: v.tolist() for k, v in data.items()})
    trainer = IPUTrainer(
        tiny_model(CLASS),
        IPUConfig(gradient_accumulation_steps=accumulation),
        arguments(tmp_path, per_device_train_batch_size=micro),
        train_dataset=train,
    )
    reliability.expect_clear_error(trainer.train, (f"has {rows} samples", f"({micro * accumulation} ="))
