"""Every bad input of the example scripts and the command line ends in one line on stderr and exit code 2, naming
the flag, field or file, with no traceback unless asked for (`OPTIMUM_IPU_DEBUG=1` or `--debug`).

The scripts run in this process through `run_script(main)` (what their `__main__` does; one real subprocess checks
that wiring), so each generated case costs milliseconds: they fail while parsing or reading data, before any model
is loaded.
"""

from __future__ import annotations

import contextlib
import io
import math
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimum_ipu.cli import main as cli_main
from optimum_ipu.errors import run_script

from ..conftest import REPO_ROOT, SHARED_DATA
from ..helpers import env, load_script, one_clear_line, run_main, run_python

QA_DIR = REPO_ROOT / "examples" / "question-answering"
GLUE_DIR = REPO_ROOT / "examples" / "text-classification"
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def run_qa():
    return load_script(QA_DIR, "run_qa", "reliability")


@pytest.fixture(scope="module")
def run_glue():
    return load_script(GLUE_DIR, "run_glue", "reliability")


def qa_argv(tmp_path, *extra: str) -> list[str]:
    data = SHARED_DATA / "squad" / "squad-v1.1-dev-articles-00-39.json"
    return [
        "--model_name_or_path",
        "unused",
        "--train_file",
        str(data),
        "--train_articles",
        "0:1",
        "--do_train",
        "--output_dir",
        str(tmp_path / "out"),
        "--report_to",
        "none",
        *extra,
    ]


QA_COUNTS = (
    "max_seq_length",
    "n_best_size",
    "max_answer_length",
    "max_sequences_per_pack",
    "max_train_samples",
    "max_eval_samples",
    "max_predict_samples",
)


@SETTINGS
@given(flag=st.sampled_from(QA_COUNTS), value=st.integers(-(10**9), 0))
def test_run_qa_counts_below_one(run_qa, tmp_path, flag, value, reliability):
    """`--n_best_size 0` and `--max_answer_length -1` gave EM/F1 0.0 silently; `--max_seq_length 0` a traceback."""
    code, stderr = run_main(run_qa, qa_argv(tmp_path, f"--{flag}={value}"))
    one_clear_line(reliability, code, stderr, (f"--{flag}", str(value)))


@SETTINGS
@given(stride=st.integers(-(10**6), -1) | st.integers(384, 10**6))
def test_run_qa_doc_stride_outside_the_window(run_qa, tmp_path, stride, reliability):
    code, stderr = run_main(run_qa, qa_argv(tmp_path, f"--doc_stride={stride}"))
    one_clear_line(reliability, code, stderr, ("--doc_stride", str(stride)))


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        (["--gradient_accumulation_steps=-2"], ("--gradient_accumulation_steps", "-2")),
        (["--gradient_accumulation_steps=0"], ("--gradient_accumulation_steps", "0")),
        (["--loss_scaling=nan"], ("--loss_scaling", "nan")),
        (["--loss_scaling=1e-30"], ("--loss_scaling", "1e-30")),
        (["--resume_from_checkpoint", "no/such/checkpoint-9"], ("--resume_from_checkpoint", "no such folder")),
        (["--ipu_config_overrides", "ipus_per_replica=1000000000"], ("`ipus_per_replica`", "1000000000")),
        (["--ipu_config_overrides", "output_mode=" + "x" * 100_000], ("`output_mode`",)),
    ],
    ids=[
        "accumulation-negative",
        "accumulation-zero",
        "scale-nan",
        "scale-tiny",
        "resume-missing",
        "huge-ipus",
        "10MB-value",
    ],
)
def test_run_qa_bad_training_arguments(run_qa, tmp_path, extra, names, reliability):
    argv = qa_argv(tmp_path, *extra)
    if "--ipu_config_overrides" in extra:  # reached when the trainer loads the config: after the data
        argv += ["--max_train_samples", "2"]
    code, stderr = run_main(run_qa, argv)
    one_clear_line(reliability, code, stderr, names)


GLUE_FILES = {
    # (file name, content, task, names the error must hold besides the file)
    "missing label": ("train.tsv", "sentence\tlabel\na fine film\t1\na dull film\t\n", "sst2", ("row 2",)),
    "missing label, no task": ("train.tsv", "sentence\tlabel\na fine film\tpos\na dull film\t\n", None, ("row 2",)),
    "label -1 with a task": ("train.tsv", "sentence\tlabel\na fine film\t1\na dull film\t-1\n", "sst2", ("-1",)),
    "nan regression label": ("train.csv", "sentence1,sentence2,label\na,b,0.5\nc,d,nan\n", "stsb", ("row 2",)),
    "empty file": ("train.tsv", "", "sst2", ("GLUE TSV",)),
    "extra column": ("train.tsv", "sentence\tlabel\na fine film\t1\textra\textra\n", "sst2", ("line 2",)),
}


@pytest.mark.parametrize("case", sorted(GLUE_FILES))
def test_run_glue_bad_files_name_the_file(run_glue, tmp_path, case, reliability):
    name, content, task, names = GLUE_FILES[case]
    path = tmp_path / name
    path.write_text(content)
    argv = [
        "--model_name_or_path",
        "unused",
        "--train_file",
        str(path),
        "--do_train",
        "--output_dir",
        str(tmp_path / "out"),
        "--report_to",
        "none",
        *(["--task_name", task] if task else []),
    ]
    code, stderr = run_main(run_glue, argv)
    one_clear_line(reliability, code, stderr, (str(path), *names))


def test_run_glue_non_utf8_tsv_names_the_file(run_glue, tmp_path, reliability):
    path = tmp_path / "latin1.tsv"
    path.write_bytes("sentence\tlabel\nun film très réussi\t1\n".encode("latin-1"))
    argv = [
        "--model_name_or_path",
        "unused",
        "--task_name",
        "sst2",
        "--train_file",
        str(path),
        "--do_train",
        "--output_dir",
        str(tmp_path / "out"),
    ]
    code, stderr = run_main(run_glue, argv)
    one_clear_line(reliability, code, stderr, (str(path),))


def test_run_glue_empty_evaluation_set_stops_before_training(run_glue, tmp_path, tiny_pretrained, reliability):
    """An empty evaluation set failed after training and saving; now before any work."""
    model = tiny_pretrained("BertForSequenceClassification", num_labels=2)
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    train.write_text("sentence\tlabel\na fine film\t1\na dull film\t0\n")
    dev.write_text("sentence\tlabel\n")
    out = tmp_path / "out"
    argv = [
        "--model_name_or_path",
        str(model),
        "--task_name",
        "sst2",
        "--train_file",
        str(train),
        "--validation_file",
        str(dev),
        "--do_train",
        "--do_eval",
        "--output_dir",
        str(out),
        "--report_to",
        "none",
        "--max_seq_length",
        "16",
    ]
    code, stderr = run_main(run_glue, argv)
    one_clear_line(reliability, code, stderr, ("--do_eval", "empty"))
    assert not out.exists() or not any(out.iterdir()), "the run wrote before it stopped"


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--seq-len", "0"], ("--seq-len", "0")),
        (["--batch-size", "-4"], ("--batch-size", "-4")),
        (["--steps", "0"], ("--steps",)),
        (["--warmup", "-1"], ("--warmup",)),
    ],
)
def test_benchmark_arguments(argv, names, reliability):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        cli_main(["benchmark", *argv])
    one_clear_line(reliability, exit_.value.code, err.getvalue(), names)


def test_the_real_entry_point_and_the_debug_switch(tmp_path, reliability):
    """`python run_qa.py` itself: one line and exit 2; with OPTIMUM_IPU_DEBUG=1 the traceback is there."""
    argv = ["run_qa.py", *qa_argv(tmp_path, "--doc_stride=-5")]
    run = run_python(argv, cwd=QA_DIR, env=env(), timeout=600)
    one_clear_line(reliability, run.returncode, run.stderr, ("run_qa.py: error: --doc_stride -5",))
    debug = run_python(argv, cwd=QA_DIR, env=env(OPTIMUM_IPU_DEBUG="1"), timeout=600)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "--doc_stride -5" in debug.stderr


def test_a_run_that_trains_nothing_is_exit_1_with_one_line(reliability):
    """Not a bad input, but not a bug either: a run stopped for a reason it names (here fp16 that skipped every
    step) ends with exit code 1 and one line."""
    from optimum_ipu.errors import SkippedStepsError

    def main():
        raise SkippedStepsError(f"fp16: every optimizer step of this run (4) overflowed, loss scale {math.inf}")

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        run_script(main, "run_x.py")
    last = err.getvalue().strip().splitlines()
    assert exit_.value.code == 1 and len(last) == 1 and "every optimizer step" in last[0], err.getvalue()


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device", "out/checkpoint-4/optimizer.pt"),
        RuntimeError(
            "[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file: file write failed"
        ),
        Exception(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        ),
    ],
    ids=["oserror", "torch-save", "safetensors"],
)
def test_a_full_disk_says_so_in_one_line(error, reliability):
    """A full disk, as each writer reports it (simulated: a real one needs a filesystem to fill)."""

    def main():
        raise error

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        run_script(main, "run_x.py")
    lines = err.getvalue().strip().splitlines()
    clear = exit_.value.code == 1 and len(lines) == 1 and "No space left on device" in lines[0]
    assert reliability.fault(clear), err.getvalue()


def test_a_bare_debug_flag_shows_the_traceback_and_is_not_passed_on(monkeypatch):
    """`--debug` alone asks for the traceback (it is removed, so the script's parser never sees it); transformers'
    own `--debug VALUE` is left alone."""
    seen = {}

    def main():
        seen["argv"] = list(sys.argv)
        raise ValueError("--doc_stride -5: expected 0 <= doc_stride < --max_seq_length (384)")

    monkeypatch.delenv("OPTIMUM_IPU_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", ["run_x.py", "--output_dir", "o", "--debug"])
    with pytest.raises(ValueError, match="--doc_stride -5"):  # the exception itself: Python prints its traceback
        run_script(main)
    assert seen["argv"] == ["run_x.py", "--output_dir", "o"]
    monkeypatch.setattr(sys, "argv", ["run_x.py", "--debug", "underflow_overflow"])
    with pytest.raises(SystemExit):  # not a request for the traceback: one line, exit 2
        run_script(main)
    assert seen["argv"] == ["run_x.py", "--debug", "underflow_overflow"]


@pytest.mark.parametrize("script", ["summarization/run_summarization.py", "translation/run_translation.py"])
def test_seq2seq_scripts_end_a_bad_argument_in_one_line(script, tmp_path):
    """The seq2seq scripts go through run_script too: a bad flag value is one line, exit 2, no traceback."""
    argv = [str(REPO_ROOT / "examples" / script), "--model_name_or_path", str(tmp_path / "no-such-model")]
    argv += ["--output_dir", str(tmp_path / "out"), "--do_train", "--gradient_accumulation_steps", "0"]
    run = run_python([*argv, "--train_file", str(tmp_path / "missing.json")], env=env(), timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.strip() and "warn" not in line.lower()]
    assert "Traceback" not in run.stderr and len(lines) == 1 and "error" in lines[0], run.stderr[-2000:]
