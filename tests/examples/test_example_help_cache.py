"""The help cache of the example scripts (example_utils/help_cache.py, issue 29) never shows a stale text: an edited
script, argument source, version, Python build or locale makes its entry stale; another terminal width gets the help
wrapped for it; only a lone `-h` or `--help` reads it; a broken or unwritable cache changes nothing; `make setup`'s
`python -m example_utils.cache_help` fills it for several scripts in one process."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from example_utils import help_cache, help_layout

from ..conftest import REPO_ROOT
from ..helpers import run_python
from .help_runs import cached_answer, copy_of_qa, full_parser, help_env


def test_an_edited_script_never_gets_its_old_help(tmp_path):
    script, cache = copy_of_qa(tmp_path), tmp_path / "cache"
    before = full_parser(script, "--help", cache=cache)
    assert "Tokens per feature" in before.stdout
    script.write_text(script.read_text().replace("Tokens per feature", "Tokens in each feature"))
    after = full_parser(script, "--help", cache=cache)  # the lookup runs here as in a fresh process: stale, not shown
    assert (
        after.returncode == 0 and "Tokens in each feature" in after.stdout and "Tokens per feature" not in after.stdout
    )
    assert len(list(cache.glob("run_qa-*.json"))) == 1  # the old script's entry removed
    fast, modules = cached_answer(script, "--help", cache=cache)
    assert fast.stdout == after.stdout and "torch" not in modules


def test_only_a_lone_help_flag_is_answered_from_the_cache(tmp_path):
    """A planted entry (the key right, the text not the parser's) shows which command lines read the cache."""
    script, cache = copy_of_qa(tmp_path), tmp_path / "cache"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in help_env(cache).items():
            patch.setenv(name, value)
        path = help_cache.entry_path(str(script), script.name)
    Path(path).parent.mkdir(parents=True)
    planted = argparse.ArgumentParser(prog="run_qa.py", description="planted help")
    Path(path).write_text(json.dumps({"sources": {}, "layout": help_layout.parser_layout(planted)}))
    assert cached_answer(script, "-h", cache=cache)[0].stdout == planted.format_help()
    for args in (["--help", "--max_seq_length", "64"], ["--hel"], ["--doc_stride", "-h"]):
        result = full_parser(script, *args, cache=cache)
        assert "planted" not in result.stdout + result.stderr
        assert (result.returncode, result.stdout.startswith("usage: run_qa.py")) in ((0, True), (2, False)), args
    bad = full_parser(script, "--max_seq_length", "many", cache=cache)
    assert bad.returncode == 2 and "--max_seq_length/--max-seq-length: invalid int value: 'many'" in bad.stderr


def test_another_terminal_width_gets_the_help_wrapped_for_it(tmp_path):
    script, cache = REPO_ROOT / "examples" / "question-answering" / "run_qa.py", tmp_path / "cache"
    assert full_parser(script, "--help", cache=cache).returncode == 0  # cached at 100 columns
    narrow = full_parser(script, "--help", cache=tmp_path / "off", COLUMNS="60")
    fast, modules = cached_answer(script, "--help", cache=cache, COLUMNS="60")
    assert fast.stdout == narrow.stdout and "torch" not in modules
    wide = full_parser(script, "--help", cache=cache)  # answered from the same entry at 100 columns
    assert wide.stdout != fast.stdout and len(wide.stdout.splitlines()) < len(fast.stdout.splitlines())


def test_cache_help_fills_the_cache_for_several_scripts_in_one_process(tmp_path):
    scripts = [
        REPO_ROOT / "examples" / folder / name
        for folder, name in (("question-answering", "run_qa.py"), ("translation", "run_translation.py"))
    ]
    result = run_python(["-m", "example_utils.cache_help", *map(str, scripts)], env=help_env(tmp_path))
    assert result.returncode == 0 and "help cached for 2 of 2 example scripts" in result.stdout, result.stderr[-2000:]
    for script in scripts:  # each answered from the cache, as its own full parser prints it
        fast, modules = cached_answer(script, "--help", cache=tmp_path)
        assert fast.stdout == full_parser(script, "--help", cache=tmp_path / "off").stdout and "torch" not in modules
    missing = run_python(["-m", "example_utils.cache_help", "nope.py"], env=help_env(tmp_path))
    assert missing.returncode == 2 and missing.stderr.strip() == "cache_help: error: nope.py: give script paths"


def test_a_parser_drawn_from_more_than_its_layout_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(help_cache.CACHE_ENV, str(tmp_path / "cache"))
    script = tmp_path / "run_toy.py"
    script.write_text("print('toy')\n")
    parser = argparse.ArgumentParser(prog="run_toy.py", formatter_class=argparse.MetavarTypeHelpFormatter)
    parser.add_argument("--size", type=int, default=3)
    exclusive = argparse.ArgumentParser(prog="run_toy.py")
    exclusive.add_mutually_exclusive_group().add_argument("--a", action="store_true")
    assert help_layout.parser_layout(parser) is None and help_layout.parser_layout(exclusive) is None
    help_cache.cache_help(str(script), parser, [ToyArguments])
    assert help_cache.cached_help(str(script), "run_toy.py") is None


def test_an_unwritable_cache_changes_nothing(tmp_path):
    script = REPO_ROOT / "examples" / "question-answering" / "run_qa.py"
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder under a file cannot be made, whoever runs the test
    unwritable = full_parser(script, "--help", cache=blocker / "help")
    written = full_parser(script, "--help", cache=tmp_path / "written")
    assert unwritable.returncode == written.returncode == 0 and unwritable.stderr == written.stderr == ""
    assert unwritable.stdout == written.stdout
    assert not (blocker / "help").exists() and len(list((tmp_path / "written").glob("run_qa-*.json"))) == 1


# ------------------------------------------------------------------ the key, in this process


@dataclass
class ToyArguments:
    size: int = field(default=3, metadata={"help": "How many."})


def toy(tmp_path: Path, monkeypatch) -> tuple[str, argparse.ArgumentParser]:
    monkeypatch.setenv(help_cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "100")
    script = tmp_path / "run_toy.py"
    script.write_text("print('toy')\n")
    parser = argparse.ArgumentParser(prog="run_toy.py")
    parser.add_argument("--size", type=int, default=3, help="How many.")
    help_cache.cache_help(str(script), parser, [ToyArguments])
    assert help_cache.cached_help(str(script), "run_toy.py") == parser.format_help()
    return str(script), parser


def test_the_entry_is_stale_when_anything_that_shapes_the_text_changes(tmp_path, monkeypatch):
    script, _ = toy(tmp_path, monkeypatch)
    changes = {  # each returns the prog the script runs as
        "prog": lambda patch: "run_toy2.py",
        "optimum-ipu version": lambda patch: patch.setattr(help_cache, "_versions", lambda: {"optimum-ipu": "9"}),
        "python": lambda patch: patch.setattr(sys, "version", sys.version + " (another build)"),
        "locale": lambda patch: patch.setenv("LANGUAGE", "xx"),
        "script": lambda patch: Path(script).write_text("print('toy 2')\n") and None,
    }
    assert help_cache.cached_help(script, "run_toy.py") is not None
    for what, change in changes.items():
        with monkeypatch.context() as patch:
            assert help_cache.cached_help(script, change(patch) or "run_toy.py") is None, what


def test_an_edited_argument_source_makes_the_entry_stale(tmp_path, monkeypatch):
    script, parser = toy(tmp_path, monkeypatch)
    entry = help_cache.entry_path(script, "run_toy.py")
    sources = json.loads(Path(entry).read_text())["sources"]
    assert (
        os.path.realpath(__file__) in sources and os.path.realpath(script) in sources
    )  # ToyArguments' module, the script
    assert os.path.realpath(help_cache.__file__) in sources  # example_utils' own
    assert os.path.realpath(argparse.__file__) in sources  # the parser's class
    source = tmp_path / "shapes_help.py"
    source.write_text("HELP = 'one'\n")
    planted = json.loads(Path(entry).read_text())
    planted["sources"][str(source)] = help_cache._file_digest(str(source))
    Path(entry).write_text(json.dumps(planted))
    assert help_cache.cached_help(script, "run_toy.py") == parser.format_help()
    source.write_text("HELP = 'two'\n")
    assert help_cache.cached_help(script, "run_toy.py") is None
    source.unlink()
    assert help_cache.cached_help(script, "run_toy.py") is None


def test_a_broken_entry_or_an_unwritable_folder_is_no_error(tmp_path, monkeypatch):
    script, parser = toy(tmp_path, monkeypatch)
    entry = Path(help_cache.entry_path(script, "run_toy.py"))
    entry.write_text("{not json")
    assert help_cache.cached_help(script, "run_toy.py") is None
    help_cache.cache_help(script, parser, [ToyArguments])  # rewritten
    assert help_cache.cached_help(script, "run_toy.py") == parser.format_help()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(help_cache.CACHE_ENV, str(blocker / "help"))
    help_cache.cache_help(script, parser, [ToyArguments])  # no error
    assert help_cache.cached_help(script, "run_toy.py") is None
    monkeypatch.setenv(help_cache.CACHE_ENV, "off")
    assert help_cache.entry_path(script, "run_toy.py") is None
    monkeypatch.delenv(help_cache.CACHE_ENV)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert help_cache.cache_dir() == os.path.join(tmp_path, "hf", "optimum_ipu", "help")
