"""The `optimum-ipu` command: env, config check, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess

from .helpers import env, run_python


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_python(["-m", "optimum_ipu.cli", *args], env=env(), timeout=300)


def test_env_lists_versions_devices_and_slots():
    result = run_cli("env", "--ipu-config", "Graphcore/bert-base-ipu")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("Copy-and-paste the text below in your GitHub issue")  # transformers env's layout
    for package in ("optimum-ipu", "transformers", "torch", "accelerate", "datasets", "huggingface_hub", "onnxruntime"):
        assert f"- `{package}` version: " in out, package
    for label in ("Platform", "Python version", "CUDA version (torch build)", "GPU type", "CPUs usable"):
        assert f"- {label}: " in out, label
    assert "Devices found: 1 x cpu" in out
    assert "IPUs (device slots) for training: 4 = 4 per replica x 1 replicas" in out
    assert "stages share a device and run in turn" in out


def test_config_check_prints_stage_layout(minilm_dir):
    result = run_cli("config", "check", "Graphcore/bert-base-ipu", "--model", str(minilm_dir), "--n-ipu", "16")
    assert result.returncode == 2  # 4 x 4 layers do not fit MiniLM's 6 layers
    assert "valid IPUConfig" in result.stdout and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "optimum-ipu: error: IPUConfig field `layers_per_ipu`: got [0, 4, 4, 4]; it places 12 layers but the model "
        "has 6; make the entries sum to 6 or use -1 wildcards."
    )


def test_config_check_resolves_wildcards(tmp_path, minilm_dir):
    (tmp_path / "ipu_config.json").write_text(
        json.dumps({"layers_per_ipu": [0, -1, -1], "inference_layers_per_ipu": [-1], "matmul_proportion": 0.3})
    )
    result = run_cli("config", "check", str(tmp_path), "--model", str(minilm_dir))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "valid IPUConfig" in out and "matmul_proportion" in out and "no effect" in out
    assert "stage layout for BertModel (6 layers)" in out
    assert "  ipu0: embeddings\n  ipu1: layers 0-2\n  ipu2: layers 3-5 + heads" in out
    assert "  ipu0: embeddings + layers 0-5 + heads" in out  # inference layout


def test_config_check_counts_tensor_parallel_devices(tmp_path):
    (tmp_path / "ipu_config.json").write_text(
        json.dumps({"layers_per_ipu": [-1, -1], "gradient_accumulation_steps": 2, "tensor_parallel_size": 2})
    )
    result = run_cli("config", "check", str(tmp_path), "--nproc-per-node", "4")
    assert result.returncode == 0, result.stderr
    assert "training: 2 IPUs per replica x 1 replicas x 2 tensor-parallel = 4 device slots;" in result.stdout
    assert "inference: 2 IPUs per replica x 1 replicas x 2 tensor-parallel = 4 device slots;" in result.stdout
    result = run_cli("config", "check", str(tmp_path), "--nproc-per-node", "2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error = result.stderr.strip()
    assert error.startswith("optimum-ipu: error: 2 processes, but") and len(error.splitlines()) == 1
    assert "`tensor_parallel_size` (2)" in error and "torchrun --nproc_per_node 4" in error


def test_bad_config_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"layers_per_ipu": [1, 2], "ipus_per_replca": 3}')
    result = run_cli("config", "check", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "optimum-ipu: error: IPUConfig has no field `ipus_per_replca`; did you mean `ipus_per_replica`?"
    )
    bad.write_text("{\n  1}")
    result = run_cli("config", "check", str(bad))
    assert result.returncode == 2 and "line 2 column 3" in result.stderr and "Traceback" not in result.stderr


def test_missing_model_is_one_line(tmp_path):
    result = run_cli("config", "check", "Graphcore/t5-small-ipu", "--model", str(tmp_path / "nothing"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--model" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_version():
    from optimum_ipu import __version__

    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"optimum-ipu {__version__}"


def test_serve_refuses_bad_options_in_one_line(tmp_path, tiny_pretrained):
    for args, words in (
        (["--port", "70000"], ["--port", "70000", "0 to 65535"]),
        (["--max-batch-size", "0"], ["--max-batch-size", "integer >= 1", "got 0"]),
        (["--request-timeout", "-1"], ["--request-timeout", "seconds > 0"]),
        (["--batch-wait-ms", "soon"], ["--batch-wait-ms", "'soon'"]),
        (["--backend", "fast"], ["--backend", "'fast'", "compile"]),
        (["--generate-kwargs", "{num_beams: 1}"], ["--generate-kwargs", "not JSON", '{"num_beams": 1}']),
        (["--generate-kwargs", "[1]"], ["--generate-kwargs", "expected a JSON object, got [1]"]),
    ):
        result = run_cli("serve", str(tmp_path), *args)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert all(w in result.stderr for w in words), result.stderr
    missing = run_cli("serve", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and missing.stderr.strip() == (
        f"optimum-ipu: error: serve {tmp_path / 'nothing'}: no such folder; give a model folder or a Hub id in the "
        "local Hugging Face cache"
    )
    unknown = run_cli("serve", str(tiny_pretrained("BertForSequenceClassification")), "--task", "sentiment")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert "unknown task 'sentiment'" in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1
    t5 = str(tiny_pretrained("T5ForConditionalGeneration"))
    uncompiled = run_cli("serve", t5, "--task", "text2text-generation", "--backend", "compile")
    assert uncompiled.returncode == 2 and len(uncompiled.stderr.strip().splitlines()) == 1, uncompiled.stderr
    assert "backend='compile': this task runs eager" in uncompiled.stderr
    # generation arguments for every request: only where requests cannot carry them (transcriptions)
    gpt2 = str(tiny_pretrained("GPT2LMHeadModel"))
    per_request = run_cli("serve", gpt2, "--generate-kwargs", '{"num_beams": 2}')
    assert per_request.returncode == 2 and len(per_request.stderr.strip().splitlines()) == 1, per_request.stderr
    assert (
        "--generate-kwargs: the text-generation task takes its generation arguments per request" in per_request.stderr
    )
