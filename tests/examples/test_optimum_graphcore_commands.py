"""Optimum Graphcore's example commands (`optimum_graphcore_commands.py`) through our scripts' own parsers.

Each command is parsed by its script's `main()` up to `example_utils.parse_args` (nothing is loaded or trained),
with only its placeholder paths swapped for local files; then its IPU config is loaded (the `Graphcore/*-ipu` ids
load offline). It parses, and every flag it gives has the value it gave, or it stops in one line that names the flag
(or IPU config field) that differs here and why. Scripts that Optimum Graphcore has and this library does not are
listed in `WITHOUT_SCRIPT`, and docs/migrating.md says so.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import example_utils  # installed with the package (`pip install -e ".[examples]"`), as the scripts import it
import pytest

from optimum_ipu import IPUTrainingArguments

from ..conftest import REPO_ROOT
from .optimum_graphcore_commands import COMMANDS, Command

EXAMPLES = REPO_ROOT / "examples"

# Optimum Graphcore's scripts that have no counterpart here (docs/migrating.md says so): none since run_vqa.py.
WITHOUT_SCRIPT: dict[str, str] = {}
# Script names that Optimum Graphcore has in two example folders: the command's own folder's script is its counterpart.
IN_TWO_FOLDERS = {"run_pretraining.py"}
# Commands refused while parsing: the flag the one-line error starts with (Optimum Graphcore's script refused
# `--config_overrides` with `--model_name_or_path` as well: its README's GPT-2 commands never ran there either).
REFUSED = {
    "readme:language-modeling/run_clm-1": "--config_overrides",
    "readme:language-modeling/run_clm-2": "--config_overrides",
}
# Commands that parse and whose IPU config overrides are refused, with the field the error names.
CONFIG_REFUSED = {
    # our bundled Graphcore/bart-base-ipu has 2 stages; the README's layers_per_ipu has 4 entries
    "readme:summarization/run_summarization-3": "layers_per_ipu",
    # a poptorch option of release 0.5 that Optimum Graphcore itself dropped later
    "v0_5_0:summarization/run_summarization-1": "sharded_execution_for_inference",
    "v0_5_0:summarization/run_summarization-3": "sharded_execution_for_inference",
}
# Optimum Graphcore's spellings: the argument each sets here, and to what, from the value given.
TRANSLATED = {
    "pod_type": ("n_ipu", lambda value: int(value.removeprefix("pod"))),
    "evaluation_strategy": ("eval_strategy", str),
    "lr_schedule": ("lr_scheduler_type", str),
    "push_to_hub_model_id": ("hub_model_id", str),
}
# Flags whose parsed value is not the text given, by design of transformers: "none" is read as no integration.
NORMALIZED = {"report_to"}
# Placeholder paths of the READMEs, and what each becomes here.
LOCAL_PATHS = {
    "--train_file": "train.jsonl",
    "--validation_file": "validation.jsonl",
    "--train_dir": "train_images",
}


class Parsed(Exception):
    """Raised in place of running the script: carries the dataclasses its parser returned."""


_modules: dict[Path, ModuleType] = {}


def script_path(command: Command) -> Path | None:
    """Our script of the same name, or None; in the command's own folder for a name that Optimum Graphcore has in
    two folders (`run_pretraining.py`: BERT in language-modeling, wav2vec2 in speech-pretraining)."""
    if command.script in IN_TWO_FOLDERS:
        path = EXAMPLES / Path(command.path).parent.name / command.script
        return path if path.is_file() else None
    found = sorted(EXAMPLES.glob(f"*/{command.script}"))
    return found[0] if found else None


def load_script(path: Path) -> ModuleType:
    """The script imported as a module (its folder on `sys.path` for its sibling modules), once per session."""
    if path not in _modules:
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(f"og_command_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _modules[path] = module
    return _modules[path]


def local_argv(command: Command, folder: Path) -> list[str]:
    """The command's arguments, its placeholder paths swapped for local files (nothing else changes)."""
    argv = command.argv()
    for i, arg in enumerate(argv[:-1]):
        if arg in LOCAL_PATHS:
            path = folder / LOCAL_PATHS[arg]
            if path.suffix:
                path.write_text('{"text": "a", "summary": "b"}\n', encoding="utf-8")
            else:
                (path / "label").mkdir(parents=True, exist_ok=True)
            argv[i + 1] = str(path)
    return argv


def parse(command: Command, folder: Path, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """The script's dataclasses for the command, from its own `main()` stopped at its parser."""
    module = load_script(script_path(command))
    real_parse_args = example_utils.parse_args

    def parse_and_stop(*dataclass_types: type) -> tuple:
        raise Parsed(real_parse_args(*dataclass_types))

    monkeypatch.setattr(example_utils, "parse_args", parse_and_stop)
    monkeypatch.setattr(sys, "argv", [command.script, *local_argv(command, folder)])
    with pytest.raises(Parsed) as parsed:
        module.main()
    return parsed.value.args[0]


def given_flags(argv: list[str]) -> dict[str, list[str]]:
    """`{flag name: the words after it}` of a command line (`--flag=value` split)."""
    flags: dict[str, list[str]] = {}
    name = None
    for arg in argv:
        if arg.startswith("--"):
            name, equals, value = arg[2:].partition("=")
            flags[name] = [value] if equals else []
        elif name is not None:
            flags[name].append(arg)
    return flags


def field_name(flag: str, parsed: tuple) -> str:
    """The dataclass field a flag sets: its name, or the one field it abbreviates (as argparse reads it)."""
    names = {name for each in parsed for name in vars(each)}
    if flag in names:
        return flag
    (full,) = [name for name in names if name.startswith(flag)]
    return full


def expected_value(words: list[str], current: Any) -> Any:
    """What the words given after a flag mean for a field holding `current` (as HfArgumentParser reads them)."""
    if isinstance(current, enum.Enum):
        current = current.value
    if isinstance(current, bool):
        return not words or words[0].lower() in ("true", "1", "yes")
    if isinstance(current, list):
        return words
    (word,) = words
    if isinstance(current, (int, float)) and not isinstance(current, bool):
        return type(current)(float(word) if isinstance(current, float) else int(word))
    return word


def held(obj: Any, name: str) -> Any:
    value = getattr(obj, name)
    return value.value if isinstance(value, enum.Enum) else value


@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_an_optimum_graphcore_command_runs_or_names_the_flag_that_differs(command, tmp_path, monkeypatch):
    if script_path(command) is None:
        assert command.script in WITHOUT_SCRIPT, f"{command.script}: no script here and not listed as such"
        return
    if command.name in REFUSED:
        with pytest.raises(ValueError) as refused:
            parse(command, tmp_path, monkeypatch)
        message = str(refused.value)
        assert message.startswith(REFUSED[command.name]) and "\n" not in message
        assert "leave it out" in message  # says what to do
        return
    parsed = parse(command, tmp_path, monkeypatch)
    (training_args,) = [args for args in parsed if isinstance(args, IPUTrainingArguments)]  # among model, data, peft
    argv = local_argv(command, tmp_path)
    for flag, words in given_flags(argv).items():
        if flag in TRANSLATED:
            target, meaning = TRANSLATED[flag]
            assert held(training_args, target) == meaning(words[0]), f"--{flag} {words[0]}: --{target}"
            if flag == "lr_schedule":
                continue  # a spelling only, no field of its own
        if flag in NORMALIZED:
            continue
        name = field_name(flag, parsed)
        (owner,) = [each for each in parsed if name in vars(each)]
        assert held(owner, name) == expected_value(words, held(owner, name)), f"--{flag} {' '.join(words)}"
    if command.name in CONFIG_REFUSED:
        with pytest.raises(ValueError, match=CONFIG_REFUSED[command.name]) as refused:
            training_args.load_ipu_config()
        assert "\n" not in str(refused.value)
        return
    config = training_args.load_ipu_config()
    if training_args.n_ipu:  # the pod's devices: replicas of the config's pipeline
        assert config.replication_factor * config.ipus_per_replica == training_args.n_ipu


def test_every_script_without_a_counterpart_is_in_the_commands():
    """`WITHOUT_SCRIPT` lists only scripts that Optimum Graphcore's commands use and this library lacks."""
    missing = {c.script for c in COMMANDS if script_path(c) is None}
    assert missing == set(WITHOUT_SCRIPT)


@pytest.mark.parametrize("flag", sorted(example_utils.OPTIMUM_GRAPHCORE_ONLY_FLAGS))
def test_a_flag_that_means_nothing_here_is_one_line_naming_it(flag, tmp_path, monkeypatch):
    command = next(c for c in COMMANDS if c.name == "readme:question-answering/run_qa-1")
    command = Command(command.name, command.path, command.commit, f"{command.text.rstrip()} {flag}=1\n")
    with pytest.raises(ValueError) as refused:
        parse(command, tmp_path, monkeypatch)
    message = str(refused.value)
    assert message.startswith(f"{flag} (an Optimum Graphcore flag): ") and "\n" not in message
    assert message.split(": ", 1)[1] == example_utils.OPTIMUM_GRAPHCORE_ONLY_FLAGS[flag]


def training_args(tmp_path: Path, *argv: str) -> Any:
    from transformers import HfArgumentParser

    from optimum_ipu import IPUTrainingArguments

    (parsed,) = HfArgumentParser(IPUTrainingArguments).parse_args_into_dataclasses(
        args=["--output_dir", str(tmp_path / "run"), *argv]
    )
    return parsed


def test_optimum_graphcore_spellings_set_what_replaced_them(tmp_path):
    args = training_args(
        tmp_path,
        *("--push_to_hub_organization", "Graphcore", "--push_to_hub_token", "hf_x", "--group_by_length"),
        "--include_inputs_for_metrics",
    )
    assert args.hub_model_id == "Graphcore/run"  # the output folder's name, as transformers 4 named the repository
    assert args.hub_token == "hf_x"
    assert args.train_sampling_strategy == "group_by_length"
    assert args.include_for_metrics == ["inputs"]
    args = training_args(tmp_path, "--push_to_hub_model_id", "vit-cats", "--push_to_hub_organization", "org")
    assert args.hub_model_id == "org/vit-cats"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pod_type", "pod16", "--n_ipu", "8"], "--pod_type pod16 and --n_ipu 8: they disagree; pass only --n_ipu"),
        (["--pod_type", "sixteen"], "--pod_type: got 'sixteen'; expected podN such as pod16 (better: --n_ipu 16)"),
        (
            ["--evaluation_strategy", "steps", "--eval_strategy", "epoch"],
            "--evaluation_strategy steps and --eval_strategy epoch: they disagree; pass only --eval_strategy",
        ),
    ],
    ids=["pod_type-vs-n_ipu", "pod_type-malformed", "evaluation_strategy-vs-eval_strategy"],
)
def test_a_spelling_that_contradicts_its_replacement_is_refused(tmp_path, argv, message):
    with pytest.raises(ValueError) as refused:
        training_args(tmp_path, *argv)
    assert str(refused.value) == message
    assert training_args(tmp_path, "--pod_type", "pod16", "--n_ipu", "16").n_ipu == 16  # agreeing: fine


def test_a_json_argument_file_reads_the_same_spellings(tmp_path, monkeypatch):
    """`script.py args.json`: Optimum Graphcore's keys are read as its flags are, or refused in the same line."""
    from optimum_ipu import IPUTrainingArguments

    arguments = tmp_path / "args.json"
    values = {"output_dir": str(tmp_path / "run"), "pod_type": "pod8", "lr_schedule": "cosine", "logging_steps": 5}
    arguments.write_text(json.dumps(values), encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["run_qa.py", str(arguments)])
    (args,) = example_utils.parse_args(IPUTrainingArguments)
    assert (args.n_ipu, args.lr_scheduler_type.value, args.logging_steps) == (8, "cosine", 5)
    arguments.write_text(json.dumps({**values, "past_index": 0}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"^--past_index \(an Optimum Graphcore flag\): transformers 5 dropped it"):
        example_utils.parse_args(IPUTrainingArguments)
