"""Two bad config values of issue 42, item 11: a number past Python's 4,300 integer digits in an override
(`--ipu_config_overrides`, `IPUConfig.update_from_string`, the examples' `--config_overrides`) names the field and
the limit, not Python's own words; an `executable_cache_dir` that is a file, `/dev/null`, a path too long for a
filesystem or a folder that cannot be written to is one line naming the field, the value and the fix, when the
config is checked (what the path itself says) or when the cache is first used (what the filesystem says), with
`backend="auto"` too (not a silent fall back to eager)."""

from __future__ import annotations

import os
import sys

import pytest
import transformers

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig, IPUTrainingArguments, to_pipelined
from optimum_ipu.runtime.inference.runner import InferenceRunner
from optimum_ipu.runtime.process_flags import configure_compile_cache

from ..conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))
import example_utils  # noqa: E402

LIMIT = sys.get_int_max_str_digits()
HUGE = "9" * (LIMIT + 700)
CLEAR = (IncompatibleIPUConfigError,)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        (f"device_iterations={HUGE}", "device_iterations"),
        (f"gradient_accumulation_steps=-{HUGE}", "gradient_accumulation_steps"),
        (f"layers_per_ipu=[1 {HUGE} -1]", "layers_per_ipu"),
        (f'parallelize_kwargs={{"max_length": {HUGE}}}', "parallelize_kwargs"),
    ],
)
def test_a_number_past_pythons_digit_limit_names_the_field(reliability, override, field):
    names = (f"`{field}`", f"{len(HUGE)}-digit", str(LIMIT))
    err = reliability.expect_clear_error(lambda: IPUConfig().update_from_string(override), names, CLEAR)
    assert len(str(err)) < 300
    args = IPUTrainingArguments("unused", ipu_config_overrides=override, report_to=[])
    reliability.expect_clear_error(args.load_ipu_config, names, CLEAR)


def test_a_field_name_of_thousands_of_digits_is_not_echoed_whole(reliability):
    err = reliability.expect_clear_error(lambda: IPUConfig().update_from_string(f"{HUGE}=1"), "has no field", CLEAR)
    assert len(str(err)) < 300


@pytest.mark.parametrize("overrides", [f"hidden_size={HUGE}", f'{{"hidden_size": {HUGE}}}'])
def test_the_examples_config_overrides_name_the_key(reliability, overrides):
    names = ("--config_overrides", "`hidden_size`", f"{len(HUGE)}-digit", str(LIMIT))
    err = reliability.expect_clear_error(lambda: example_utils.new_config("bert", overrides), names)
    assert len(str(err)) < 300


# ------------------------------------------------------------------ executable_cache_dir
@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("/tmp/" + "x" * 300, "300 bytes long, over the 255"),
        ("/tmp/" + ("y" * 200 + "/") * 25, "over the 4096"),
        ("cache\0dir", "NUL character"),
    ],
    ids=["long-name", "long-path", "nul"],
)
def test_a_path_no_filesystem_holds_is_refused_when_the_config_is_checked(reliability, value, problem):
    names = ("`executable_cache_dir`", problem, "give a folder path")
    err = reliability.expect_clear_error(lambda: IPUConfig(executable_cache_dir=value), names, CLEAR)
    assert len(str(err)) < 500


def _not_a_folder(tmp_path) -> dict[str, tuple[str, str]]:
    (tmp_path / "a-file").write_text("x")
    return {
        "file": (str(tmp_path / "a-file"), "is a file, not a folder"),
        "dev-null": ("/dev/null", "is a character device, not a folder"),
        "under-a-file": (str(tmp_path / "a-file" / "cache"), "a-file, on its path, is a file"),
        "proc": ("/proc", "cannot write to it"),  # no process writes there, root included
    }


def _bert() -> transformers.BertForSequenceClassification:
    config = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37
    )
    return transformers.BertForSequenceClassification(config).eval()


@pytest.mark.parametrize("kind", ["file", "dev-null", "under-a-file", "proc"])
def test_a_cache_folder_that_cannot_be_one_is_said_when_first_used(tmp_path, monkeypatch, reliability, kind):
    """The compile cache (`torch.compile`, `--torch_compile`) and the ONNX graph cache of `pipeline()` alike."""
    if kind == "proc" and not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    value, problem = _not_a_folder(tmp_path)[kind]
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    names = ("`executable_cache_dir`", repr(value), problem, "give a folder this process can write to")
    reliability.expect_clear_error(lambda: configure_compile_cache(value), names, CLEAR)
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    config = IPUConfig(executable_cache_dir=value)
    model = to_pipelined(_bert(), config).eval()
    for backend in ("onnxruntime", "auto"):
        run = lambda: InferenceRunner(model, config, backend=backend, max_seq_length=16, input_names=["input_ids"])  # noqa: B023, E731
        reliability.expect_clear_error(run, names, CLEAR)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_cache_folder_is_said_when_first_used(tmp_path, reliability):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        names = ("`executable_cache_dir`", "cannot write to it", "Permission denied")
        reliability.expect_clear_error(lambda: configure_compile_cache(str(folder / "cache")), names, CLEAR)
    finally:
        folder.chmod(0o755)


def test_a_usable_cache_folder_is_made_and_used(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    configure_compile_cache(str(tmp_path / "new" / "cache"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "new" / "cache")
    assert (tmp_path / "new" / "cache").is_dir() and not os.listdir(tmp_path / "new" / "cache")
