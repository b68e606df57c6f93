"""Errors a newcomer can act on (issue 29, item 6): a missing file or a misspelt id is one line under 200 characters
that names the value and the fix (a did-you-mean against the bundled ids); the fix survives any cut; a missing
training file names its flag; the CLI honours --debug / OPTIMUM_IPU_DEBUG=1 and the scripts' underscore spellings;
a missing optional dependency names its extra."""

from __future__ import annotations

import argparse
import sys

import example_utils  # installed beside the library (pyproject: packages.find in examples/)
import pytest

from optimum_ipu import IncompatibleIPUConfigError
from optimum_ipu.cli.main import build_parser, main
from optimum_ipu.errors import DEBUG_ENV, elide, run_script

from .helpers import REPO_ROOT, run_example

LIMIT = 200


def cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    """`optimum-ipu ARGV` in this process: its exit code and its stderr."""
    try:
        code = main(list(argv))
    except SystemExit as stop:  # argparse's usage errors
        code = stop.code
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert len(lines[0]) < LIMIT, f"{len(lines[0])} characters: {lines[0]}"
    return lines[0]


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("Graphcore/bert-base-ipuu", "Graphcore/bert-base-ipu"),
        ("graphcore/roberta-base-ipu", "Graphcore/roberta-base-ipu"),
        ("bert-base-ipu", "Graphcore/bert-base-ipu"),
        ("Graphcore/whisper-tiny", "Graphcore/whisper-tiny-ipu"),
        ("Graphcor/t5-smal-ipu", "Graphcore/t5-small-ipu"),
    ],
)
def test_a_misspelt_config_id_is_one_line_with_a_did_you_mean(capsys, given, meant):
    code, err = cli(capsys, "config", "check", given)
    line = one_line(err)
    assert code == 2 and repr(given) in line and line.endswith(f"did you mean {meant!r}?"), line
    assert line.count("Graphcore/") <= 2  # not the list of all 26 bundled ids


def test_an_unknown_id_names_the_fix_and_the_current_download_command(capsys):
    code, err = cli(capsys, "config", "check", "someone/not-a-config")
    line = one_line(err)
    assert code == 2 and "'someone/not-a-config'" in line and "hf download ID ipu_config.json" in line, line
    assert "huggingface-cli" not in line  # a command the installed huggingface_hub no longer ships


def test_a_missing_config_file_suggests_the_file_beside_it(capsys, tmp_path):
    (tmp_path / "ipu_config.json").write_text("{}")
    missing = tmp_path / "ipu_confg.json"
    code, err = cli(capsys, "config", "check", str(missing))
    line = one_line(err)
    assert code == 2 and "ipu_confg.json'" in line and "no such file" in line, line
    assert line.endswith("did you mean 'ipu_config.json' beside it?"), line


@pytest.mark.parametrize("name", ["x" * 5000, "Graphcore/" + "bert-base-ipu" * 300, "someone/" + "y" * 3000])
def test_the_cut_of_a_huge_name_keeps_the_fix(capsys, name):
    code, err = cli(capsys, "config", "check", name)
    line = one_line(err)
    assert code == 2 and " ... " in line and line.startswith("optimum-ipu: error: no IPU config found for ")
    assert line.endswith(("ipu_config.json)", "'Graphcore/bert-base-ipu'", "?")), line


def test_elide_keeps_the_start_and_the_end():
    text = "field x: " + "v" * 500 + "; fix: do this"
    cut = elide(text, 100)
    assert len(cut) <= 100 and cut.startswith("field x: ") and cut.endswith("; fix: do this")
    assert elide("short", 100) == "short"


@pytest.mark.parametrize("flag", ["--n-ipu", "--n_ipu"])
def test_n_ipu_0_is_a_usage_error_naming_the_flag(capsys, flag):
    code, err = cli(capsys, "config", "check", "Graphcore/bert-base-ipu", flag, "0")
    line = one_line(err)
    assert code == 2 and "--n-ipu/--n_ipu" in line and "expected an integer >= 1, got 0" in line, line


def _option_strings(parser: argparse.ArgumentParser) -> list[list[str]]:
    """The option strings of every option of `parser` and of its subcommands, one list per option."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _option_strings(sub)
        elif action.option_strings:
            found.append(action.option_strings)
    return found


def test_every_dashed_option_takes_the_scripts_underscore_spelling(capsys):
    options = _option_strings(build_parser())
    dashed = [names for names in options if any("-" in n[2:] for n in names if n.startswith("--"))]
    assert len(dashed) >= 8  # --n-ipu, --nproc-per-node, --ipu-config (x2), --seq-len, --batch-size, ...
    for names in dashed:
        for name in names:
            if name.startswith("--") and "-" in name[2:]:
                assert "--" + name[2:].replace("-", "_") in names, names
    code, _ = cli(capsys, "config", "check", "Graphcore/bert-base-ipu", "--n_ipu", "16", "--nproc_per_node", "1")
    assert code == 0


@pytest.mark.parametrize("where", ["before", "after", "env"])
def test_debug_gives_the_traceback_instead_of_one_line(capsys, monkeypatch, where):
    argv = ["config", "check", "Graphcore/bert-base-ipuu"]
    argv = {"before": ["--debug", *argv], "after": [*argv, "--debug"], "env": argv}[where]
    if where == "env":
        monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(IncompatibleIPUConfigError, match="did you mean 'Graphcore/bert-base-ipu'"):
        main(argv)
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert cli(capsys, *[a for a in argv if a != "--debug"])[0] == 2  # without it: the one line


def test_a_missing_training_file_names_its_flag_and_a_near_name(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^--train_file nope\.json: no such file$"):
        example_utils.require_files({"train": "nope.json", "validation": None})
    (tmp_path / "train.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="--validation_file .*trian.json: no such file; did you mean .*train"):
        example_utils.require_files({"validation": str(tmp_path / "trian.json")})


def test_a_missing_audio_folder_names_its_flag():
    from example_utils.audio import read_audio_dirs

    args = argparse.Namespace(train_dir="nope", eval_dir=None, audio_column_name="audio")
    with pytest.raises(FileNotFoundError, match=r"^--train_dir nope: no such folder$"):
        read_audio_dirs(args)


def test_a_script_error_is_one_short_line_and_the_hint_never_makes_it_long(capsys):
    def missing() -> None:
        raise FileNotFoundError("--train_file nope.json: no such file")

    with pytest.raises(SystemExit) as stop:
        run_script(missing, prog="run_qa.py")
    line = one_line(capsys.readouterr().err)
    assert stop.value.code == 2
    assert line == f"run_qa.py: error: --train_file nope.json: no such file (set {DEBUG_ENV}=1 for the traceback)"

    def long() -> None:
        raise ValueError("x" * 150 + "; fix it like this")

    with pytest.raises(SystemExit):
        run_script(long, prog="run_qa.py")
    assert capsys.readouterr().err.strip().endswith("; fix it like this")


@pytest.mark.parametrize(
    ("script", "extra"),
    [
        ("question-answering/run_qa.py", []),
        ("summarization/run_summarization.py", []),
        ("translation/run_translation.py", ["--source_lang", "en", "--target_lang", "ro"]),
    ],
)
def test_scripts_name_the_flag_of_a_missing_training_file(script, extra, minilm_dir, tmp_path):
    folder, name = (REPO_ROOT / "examples" / script).parent, script.split("/")[1]
    argv = ["--model_name_or_path", str(minilm_dir), "--train_file", "nope.json", "--do_train"]
    result = run_example(folder, name, *argv, *extra, "--output_dir", str(tmp_path), timeout=300)
    line = one_line(result.stderr.strip().splitlines()[-1])
    assert result.returncode == 2 and line.startswith(f"{name}: error: --train_file nope.json: no such file"), line


@pytest.mark.parametrize(("module", "function"), [("soundfile", "_soundfile"), ("scipy.signal", "_resample_poly")])
def test_audio_without_its_extra_names_the_extra(monkeypatch, module, function):
    from optimum_ipu.pipelines import audio

    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ImportError, match=r'in the \[audio\] extra: pip install "optimum-ipu\[audio\]"'):
        getattr(audio, function)()
