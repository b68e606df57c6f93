"""Bad configs and arguments, property-based: every malformed `ipu_config.json`, override string or argument
combination gives one `IncompatibleIPUConfigError` (a `ValueError`) naming the field, never a traceback from deep
inside; `optimum-ipu config check` exits 2 with one line."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig
from optimum_ipu.cli import main as cli_main
from optimum_ipu.config import FIELDS
from optimum_ipu.models.layout import layers_per_stage
from optimum_ipu.topology import check_processes, replication_for_devices

from ..conftest import PYTHON
from ..helpers import env, run_python
from .config_strategies import MODE_MANAGED_FIELDS, bad_override_strings, malformed_configs, valid_config_dicts

# Bounded for a small shared CI machine; each example is pure Python (no torch) and takes milliseconds.
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONFIG_ERRORS = (IncompatibleIPUConfigError,)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("bad-configs")


def run_cli(*argv: str) -> tuple[int, str, str]:
    """`optimum-ipu ARGV` in this process (the subprocess path is tested below): exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(list(argv))
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def cli_gives_one_line(reliability, argv: list[str], names: tuple[str, ...]) -> None:
    code, out, err = run_cli(*argv)
    clear = code == 2 and err.count("\n") == 1 and err.startswith("optimum-ipu") and all(n in err for n in names)
    reliability.bad_input(clear)
    assert clear, (code, err, out)


@SETTINGS
@given(bad=malformed_configs())
def test_malformed_config_is_one_clear_error_naming_the_field(bad, reliability, folder):
    fields, names, kwargs = bad
    err = reliability.expect_clear_error(lambda: IPUConfig.from_dict(fields, **kwargs), names, CONFIG_ERRORS)
    assert len(str(err)) < 600, f"the error echoes {len(str(err))} characters"  # values cut to ~200
    # the same file through the command line
    n_ipu = kwargs.get("n_ipu")
    if n_ipu is None or (isinstance(n_ipu, int) and not isinstance(n_ipu, bool)):
        path = folder / "ipu_config.json"
        path.write_text(json.dumps(fields))
        # a count below 1 is refused by the command line's own parser first, naming the flag
        cli_names = names if n_ipu is None or n_ipu >= 1 else ("--n-ipu", f"got {n_ipu}")
        cli_gives_one_line(
            reliability, ["config", "check", str(path), *([] if n_ipu is None else ["--n-ipu", str(n_ipu)])], cli_names
        )


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 40) | st.floats(-2, 2, allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.sampled_from(["pod4", "pod16", "default", "x"]) | st.text(max_size=4), children, max_size=3
        )
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(st.sampled_from([*FIELDS, "pod_type", "n_ipu", "layers_per_ipus"]), JSON_VALUES, max_size=6)
)
def test_any_json_object_is_a_config_or_one_clear_error(fields, reliability):
    """Blind fuzzing, beside the targeted cases above: whatever the values, a config or one clear error."""
    try:
        config = IPUConfig.from_dict(fields)
    except IncompatibleIPUConfigError as err:
        assert reliability.bad_input("`" in str(err) and "\n" not in str(err)), str(err)
        return
    except Exception as err:  # any other exception is the bug this test looks for
        reliability.bad_input(False)
        raise AssertionError(f"{fields!r} raised {type(err).__name__}: {err}") from err
    assert IPUConfig.from_dict(config.to_dict()) == config  # what loads, round-trips


@SETTINGS
@given(fields=valid_config_dicts(), num_layers=st.integers(1, 12), data=st.data())
def test_config_against_the_model_and_the_job(fields, num_layers, data, reliability):
    """Layer counts that do not match the model, more device slots than processes, fewer micro-batches than
    stages, a pod that cannot hold whole replicas: each is one clear error, and everything else fits."""
    config = IPUConfig.from_dict(fields)
    for inference in (False, True):
        config.train(not inference)
        layers, field = config.layers_per_ipu, ("inference_" if inference else "") + "layers_per_ipu"
        fixed, wildcards = sum(n for n in layers if n != -1), layers.count(-1)
        # without wildcards, a surplus is taken in order (Optimum Graphcore's rule) while no slot asking for
        # layers is left with none: the slots before the last that asks for any must hold fewer than the model
        before_last = sum(layers[: max((i for i, n in enumerate(layers) if n), default=0)])
        surplus_fits = not wildcards and fixed > num_layers and before_last < num_layers
        # a wildcard asks for layers too: fewer left than wildcards would leave one empty
        short_wildcards = wildcards and 0 <= num_layers - fixed < wildcards
        if fixed > num_layers and not surplus_fits or (not wildcards and fixed < num_layers) or short_wildcards:
            reliability.expect_clear_error(lambda: layers_per_stage(config, num_layers), f"`{field}`", CONFIG_ERRORS)
        else:
            resolved = layers_per_stage(config, num_layers)
            assert sum(resolved) == num_layers and min(resolved) >= 0
            assert all(r == n for r, n in zip(resolved, layers, strict=True) if n != -1) or surplus_fits
            assert all(r for r, n in zip(resolved, layers, strict=True) if n)  # a slot that asks gets layers
    config.train()

    ipus, replicas = config.value("ipus_per_replica"), config.value("replication_factor")
    micro = config.value("gradient_accumulation_steps")
    processes = data.draw(st.sampled_from([ipus * replicas, 1]) | st.integers(2, 16), label="processes")
    if processes > 1 and processes != ipus * replicas:
        names = ("`ipus_per_replica`", "`replication_factor`", f"{processes} processes")
        reliability.expect_clear_error(lambda: check_processes(config, processes), names, CONFIG_ERRORS)
        from optimum_ipu.runtime.distributed import replicas_per_process  # the same rule, as the runtime applies it

        if (ipus * replicas) % processes:  # a multiple is an interleaved layout (tests/distributed/...interleaved...)
            reliability.expect_clear_error(lambda: replicas_per_process(config, processes), "replication_factor")
    elif processes > 1 and ipus > 1 and micro < ipus:
        reliability.expect_clear_error(
            lambda: check_processes(config, processes), "`gradient_accumulation_steps`", CONFIG_ERRORS
        )
    else:
        check_processes(config, processes)

    n_ipu = data.draw(st.integers(1, 17), label="n_ipu")
    if n_ipu % ipus:
        reliability.expect_clear_error(
            lambda: replication_for_devices(config, n_ipu), ("`ipus_per_replica`", f"n_ipu {n_ipu}"), CONFIG_ERRORS
        )
    else:
        assert replication_for_devices(config, n_ipu) * ipus == n_ipu


@SETTINGS
@given(
    fields=valid_config_dicts(),
    cut=st.floats(0.0, 1.0, exclude_max=True),
    form=st.sampled_from(["truncated", "utf-16", "yaml", "top-level list", "top-level number", "comment"]),
)
def test_broken_or_non_json_file_names_the_file(fields, cut, form, reliability, folder):
    text = json.dumps(fields, indent=2)
    path = folder / "broken.json"
    names: tuple[str, ...] = (str(path), "not valid JSON")
    if form == "truncated":
        path.write_text(text[: int(cut * len(text))])  # a strict prefix of an object is never valid JSON
    elif form == "utf-16":
        path.write_bytes(text.encode("utf-16"))
    elif form == "yaml":  # configs are JSON only: a YAML file is refused, not parsed
        path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items()))
    elif form == "comment":
        path.write_text("// tuned for pod16\n" + text)
    else:
        path.write_text(json.dumps([fields] if form == "top-level list" else 4))
        names = ("JSON object",)
    reliability.expect_clear_error(lambda: IPUConfig.from_pretrained(path), names, CONFIG_ERRORS)
    cli_gives_one_line(reliability, ["config", "check", str(path)], names)


@SETTINGS
@given(fields=valid_config_dicts(), bad=bad_override_strings(), inference=st.booleans())
def test_bad_override_string_names_the_field_and_changes_nothing(fields, bad, inference, reliability):
    update, names = bad
    if inference:  # a plain name reaches its inference twin, and the error names the twin
        names = tuple(f"`inference_{n[1:]}" if n.strip("`") in MODE_MANAGED_FIELDS else n for n in names)
    config = IPUConfig.from_dict(fields).train(not inference)
    before = config.to_dict()
    reliability.expect_clear_error(lambda: config.update_from_string(update), names, CONFIG_ERRORS)
    assert config.to_dict() == before and config.mode == ("inference" if inference else "training")


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--n-ipu", "four"], ("--n-ipu", "'four'")),
        (["--nproc-per-node", "0"], ("--nproc-per-node", "expected an integer >= 1, got 0")),
        (["--frobnicate"], ("--frobnicate",)),
        (["--n-ipu", "0"], ("--n-ipu", "expected an integer >= 1, got 0")),
        (["--n-ipu", "6"], ("`ipus_per_replica`", "n_ipu 6")),  # 4 IPUs per replica
        (["--n-ipu", "8", "--nproc-per-node", "4"], ("8 device slots", "4 processes")),
    ],
)
def test_config_check_arguments(argv, names, reliability):
    cli_gives_one_line(reliability, ["config", "check", "Graphcore/bert-base-ipu", *argv], names)


def test_config_check_subprocess_exits_2_with_one_line(tmp_path, reliability):
    """The real entry point: no traceback, one line on stderr, for a config whose micro-batches cannot feed its
    stages on separate processes and for a file that is no text."""
    (tmp_path / "ipu_config.json").write_text(json.dumps({"layers_per_ipu": [2, 2], "gradient_accumulation_steps": 1}))
    (tmp_path / "binary.json").write_bytes(bytes(range(256)))
    for argv, names in (
        ([str(tmp_path), "--nproc-per-node", "2"], ("`gradient_accumulation_steps`", "2 pipeline stages")),
        ([str(tmp_path / "binary.json")], ("binary.json", "not valid JSON")),
    ):
        run = run_python(["-m", "optimum_ipu.cli", "config", "check", *argv], env=env(), timeout=120)
        clear = run.returncode == 2 and run.stderr.count("\n") == 1 and all(n in run.stderr for n in names)
        reliability.bad_input(clear)
        assert clear and "Traceback" not in run.stdout + run.stderr, (run.returncode, run.stderr)


FILE_CASES = {
    "int over 4300 digits": ('{"replication_factor": 1' + "0" * 5000 + "}", ("4300 digits",)),
    "nested 100000 deep": ("[" * 100_000 + "]" * 100_000, ("nested too deeply",)),
    "8 GB list from 35 bytes": ('{"ipus_per_replica": 1000000000}', ("`ipus_per_replica`", "1000000000")),
    "key self": ('{"self": 1}', ("`self`",)),
    "over 1 MiB": ('{"output_mode": "' + "x" * (2 << 20) + '"}', ("over 1024 KiB",)),
}


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_hostile_config_files_are_one_clear_error(tmp_path, case, reliability):
    text, names = FILE_CASES[case]
    path = tmp_path / "ipu_config.json"
    path.write_text(text)
    err = reliability.expect_clear_error(lambda: IPUConfig.from_json_file(path), names, CONFIG_ERRORS)
    assert len(str(err)) < 600
    cli_gives_one_line(reliability, ["config", "check", str(path)], names)


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "folder"])
def test_config_paths_that_are_no_regular_file(tmp_path, kind, reliability):
    """A FIFO blocked forever and /dev/zero read until memory ran out: run in a subprocess, bounded by its timeout
    (a hang fails the test instead of the suite)."""
    if kind == "fifo":
        path = tmp_path / "ipu_config.json"
        os.mkfifo(path)
    elif kind == "folder":
        path = tmp_path / "config.json"
        path.mkdir()
    else:
        path = Path(kind)
    code = f"from optimum_ipu import IPUConfig; IPUConfig.from_json_file({str(path)!r})"
    run = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    last = run.stderr.strip().splitlines()[-1]
    clear = run.returncode != 0 and str(path) in last and ("regular file" in last or "cannot read" in last)
    assert reliability.bad_input(clear), run.stderr[-2000:]
    cli_gives_one_line(reliability, ["config", "check", str(path)], (str(path),))
