"""IPUConfig: every field, its defaults, modes, (de)serialisation and errors."""

from __future__ import annotations

import json
import logging
import subprocess

import pytest

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig, bundled_config_ids
from optimum_ipu import config as config_module
from optimum_ipu.config import FIELDS, MODE_MANAGED_FIELDS
from optimum_ipu.config_schema import METADATA_KEYS, OWN_FIELD_DEFAULTS
from optimum_ipu.models.layout import layers_per_stage

from .conftest import PYTHON

GRAPHCORE_BERT_BASE = (
    '{"embedding_serialization_factor": 1, "recompute_checkpoint_every_layer": true, "optimizer_state_offchip": false, '
    '"replicated_tensor_sharding": true, "enable_half_first_order_momentum": true, "enable_half_partials": true, '
    '"device_iterations": 1, "inference_device_iterations": 5, "replication_factor": {"pod4": 1, "pod8": 2, '
    '"pod16": 4, "pod32": 8, "pod64": 16, "default": 1}, "inference_replication_factor": {"pod4": 1, "pod8": 2, '
    '"pod16": 4, "pod32": 8, "pod64": 16, "default": 1}, "gradient_accumulation_steps": 16, "executable_cache_dir": '
    '"./exe_cache", "ipus_per_replica": 4, "layers_per_ipu": [0, 4, 4, 4], "matmul_proportion": 0.25}'
)


def test_defaults_match_graphcore():
    c = IPUConfig()
    assert c.replication_factor == 1 and c.inference_replication_factor == 1
    assert c.gradient_accumulation_steps == 1 and c.device_iterations == 1 and c.inference_device_iterations == 1
    assert c.layers_per_ipu == [-1] and c.ipus_per_replica == 1 and c.inference_ipus_per_replica == 1
    assert c.matmul_proportion == 0.2 and c.enable_half_partials is True
    assert c.embedding_serialization_factor == 1 and c.projection_serialization_factor == 1
    assert c.output_mode == "final" and c.seed is None and c.executable_cache_dir == ""
    assert c.optimizer_state_offchip is False and c.replicated_tensor_sharding is False
    assert c.recompute_checkpoint_every_layer is False and c.auto_loss_scaling is False
    assert c.parallelize_kwargs == {} and c.inference_parallelize_kwargs == {}
    assert c.mode == "training"


def test_config_module_imports_no_torch():
    code = "import sys, optimum_ipu; from optimum_ipu import IPUConfig; IPUConfig(); print('torch' in sys.modules)"
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_graphcore_bert_base_file_loads(tmp_path, caplog):
    (tmp_path / "ipu_config.json").write_text(GRAPHCORE_BERT_BASE)
    config_module.logger.warning_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="optimum_ipu.config"):
        c = IPUConfig.from_pretrained(tmp_path)
        IPUConfig.from_pretrained(tmp_path)  # the deprecated key warns once, not per load
    assert [r.message for r in caplog.records].count(
        next(r.message for r in caplog.records if "enable_half_first_order_momentum" in r.message)
    ) == 1
    assert c.layers_per_ipu == [0, 4, 4, 4] and c.ipus_per_replica == 4
    assert c.replication_factor == 1 and c.gradient_accumulation_steps == 16
    assert c.batch_size_factor() == 16 and c.batch_size_factor(for_inference=True) == 5
    assert IPUConfig.from_pretrained(tmp_path, n_ipu=16).replication_factor == 4
    assert IPUConfig.from_pretrained(tmp_path, n_ipu=64).inference_replication_factor == 16
    assert IPUConfig.from_pretrained(tmp_path, n_ipu=3).replication_factor == 1  # no pod3: default


def test_pod_type_key_and_missing_default():
    c = IPUConfig(replication_factor={"pod4": 1, "pod16": 4}, pod_type="pod16")
    assert c.replication_factor == 4
    with pytest.raises(IncompatibleIPUConfigError, match="replication_factor.*`pod8`.*default"):
        IPUConfig(replication_factor={"pod4": 1, "pod16": 4}, n_ipu=8)


@pytest.mark.parametrize("config_id", bundled_config_ids())
def test_bundled_configs_load_by_id(config_id):
    c = IPUConfig.from_pretrained(config_id)
    assert len(c.layers_per_ipu) == c.ipus_per_replica
    assert IPUConfig.from_dict(c.to_dict()) == c


def test_bundled_bert_base_is_graphcores_file():
    """The full list of bundled ids is checked against Optimum Graphcore's in test_optimum_graphcore_compat.py."""
    assert IPUConfig.from_pretrained("Graphcore/bert-base-ipu") == IPUConfig.from_dict(json.loads(GRAPHCORE_BERT_BASE))


def test_from_json_file_and_save_round_trip(tmp_path):
    c = IPUConfig(layers_per_ipu=[1, -1], gradient_accumulation_steps=8, seed=42, output_mode="all")
    path = c.save_pretrained(tmp_path / "out")
    assert path.name == "ipu_config.json" and json.loads(path.read_text()) == c.to_dict()
    assert IPUConfig.from_pretrained(path) == c and IPUConfig.from_pretrained(tmp_path / "out") == c
    assert json.loads(c.to_json_string()) == c.to_dict()
    assert set(c.to_dict()) == {*FIELDS, *METADATA_KEYS} - set(OWN_FIELD_DEFAULTS), "ours only when not 1"
    assert not list((tmp_path / "out").glob(".*tmp*")), "atomic write left its temporary file"


def test_hub_id_from_local_cache(tmp_path):
    snapshot = tmp_path / "models--someorg--bert-ipu" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "ipu_config.json").write_text(json.dumps({"layers_per_ipu": [2, 2], "gradient_accumulation_steps": 7}))
    (tmp_path / "models--someorg--bert-ipu" / "refs").mkdir()
    (tmp_path / "models--someorg--bert-ipu" / "refs" / "main").write_text("abc123")
    code = (
        "from optimum_ipu import IPUConfig; c = IPUConfig.from_pretrained('someorg/bert-ipu');"
        "print(c.gradient_accumulation_steps, c.ipus_per_replica)"
    )
    env = {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.split()
    assert out == ["7", "2"]


def test_unknown_id_is_a_clear_error():
    with pytest.raises(IncompatibleIPUConfigError, match="no IPU config found for 'nobody/none': .*check the id"):
        IPUConfig.from_pretrained("nobody/none")


def test_folder_without_config(tmp_path):
    with pytest.raises(IncompatibleIPUConfigError, match="has no ipu_config.json"):
        IPUConfig.from_pretrained(tmp_path)


def test_modes_switch_every_twin():
    kwargs = {
        "replication_factor": 2,
        "inference_replication_factor": 3,
        "layers_per_ipu": [1, 1],
        "inference_layers_per_ipu": [2],
        "ipus_per_replica": 2,
        "inference_ipus_per_replica": 1,
        "matmul_proportion": 0.3,
        "inference_matmul_proportion": 0.6,
        "device_iterations": 4,
        "inference_device_iterations": 5,
        "embedding_serialization_factor": 2,
        "inference_embedding_serialization_factor": 3,
        "projection_serialization_factor": 4,
        "inference_projection_serialization_factor": 5,
        "parallelize_kwargs": {"a": 1},
        "inference_parallelize_kwargs": {"b": 2},
        "tensor_parallel_size": 2,
        "inference_tensor_parallel_size": 1,
    }
    c = IPUConfig(**kwargs)
    assert c.eval() is c and c.mode == "inference"
    for field in MODE_MANAGED_FIELDS:
        if f"inference_{field}" in kwargs:
            assert getattr(c, field) == kwargs[f"inference_{field}"], field
    c.train()
    for field in MODE_MANAGED_FIELDS:
        if field in kwargs:
            assert getattr(c, field) == kwargs[field], field
    assert c.eval().batch_size_factor() == 2 * 4, "training's factor unless for_inference, as in Optimum Graphcore"
    assert c.batch_size_factor(for_inference=True) == 15
    assert c.device_slots == 3
    assert c.train().device_slots == 2 * 2 * 2 and c.eval().mode == "inference"
    c.device_iterations = 9  # in inference mode, writes reach the twin
    assert c.inference_device_iterations == 9 and c.train().device_iterations == 4
    assert c.to_dict()["inference_device_iterations"] == 9


def test_inference_defaults_are_graphcores():
    """Optimum Graphcore's rules: the inference layout and matmul proportions follow training; serialization not."""
    c = IPUConfig(layers_per_ipu=[3, 3], matmul_proportion=[0.1, 0.2], serialized_embedding_splits_per_ipu=[1, 1])
    assert c.inference_layers_per_ipu == [3, 3] and c.inference_ipus_per_replica == 2
    assert c.inference_matmul_proportion == [0.1, 0.2]
    assert c.inference_serialized_embedding_splits_per_ipu is None and c.inference_embedding_serialization_factor == 1
    # per-IPU proportions that do not fit the inference layout: the default 0.2
    c = IPUConfig(layers_per_ipu=[3, 3], matmul_proportion=[0.1, 0.3], inference_layers_per_ipu=[6])
    assert c.inference_ipus_per_replica == 1 and c.inference_matmul_proportion == 0.2
    # the bare wildcard keeps `ipus_per_replica` for inference; an explicit inference layout has its own length
    assert IPUConfig(ipus_per_replica=4, inference_layers_per_ipu=[-1]).inference_ipus_per_replica == 4
    assert IPUConfig(layers_per_ipu=[3, 3], inference_layers_per_ipu=[-1]).inference_ipus_per_replica == 1


def test_wildcard_broadcast_and_resolution():
    c = IPUConfig(ipus_per_replica=4)
    assert c.layers_per_ipu == [-1, -1, -1, -1]
    assert layers_per_stage(c, 12) == [3, 3, 3, 3]
    assert layers_per_stage(c, 14) == [3, 3, 4, 4]  # remainder to the last wildcards
    assert layers_per_stage(IPUConfig(layers_per_ipu=[0, -1, 2, -1]), 12) == [0, 5, 2, 5]
    assert layers_per_stage(IPUConfig(layers_per_ipu=[2, 0, 4]), 6) == [2, 0, 4]
    with pytest.raises(IncompatibleIPUConfigError, match="places 6 layers but the model has 12"):
        layers_per_stage(IPUConfig(layers_per_ipu=[2, 0, 4]), 12)
    with pytest.raises(IncompatibleIPUConfigError, match="explicitly but the model has only 4"):
        layers_per_stage(IPUConfig(layers_per_ipu=[3, 3, -1]), 4)
    # a wildcard asks for layers, as a count does: 2 layers over 3 wildcards would leave a stage empty
    with pytest.raises(IncompatibleIPUConfigError, match="its 3 -1 wildcards share the 2 layers .* would hold none"):
        layers_per_stage(IPUConfig(layers_per_ipu=[-1, -1, -1]), 2)
    with pytest.raises(IncompatibleIPUConfigError, match="its 1 -1 wildcards share the 0 layers"):
        layers_per_stage(IPUConfig(layers_per_ipu=[4, -1]), 4)
    # the mode's layout, or the one asked for
    c = IPUConfig(layers_per_ipu=[-1, -1], inference_layers_per_ipu=[-1])
    assert layers_per_stage(c.eval(), 6) == [6] and layers_per_stage(c, 6, inference=False) == [3, 3]


def test_update_from_string():
    c = IPUConfig(ipus_per_replica=3)
    c.update_from_string("gradient_accumulation_steps=32,layers_per_ipu=[1 2 -1], seed=7, output_mode=all")
    assert c.gradient_accumulation_steps == 32 and c.layers_per_ipu == [1, 2, -1] and c.seed == 7
    assert c.output_mode == "all"
    c.update_from_string("recompute_checkpoint_every_layer=true,matmul_proportion=[0.1, 0.2, 0.3]")
    assert c.recompute_checkpoint_every_layer is True and c.matmul_proportion == [0.1, 0.2, 0.3]
    c.eval().update_from_string("device_iterations=6")
    assert c.inference_device_iterations == 6 and c.to_dict()["device_iterations"] == 1
    before = c.to_dict()
    with pytest.raises(IncompatibleIPUConfigError, match="layers_per_ipu"):
        c.train().update_from_string("layers_per_ipu=[1 2]")  # 2 entries for 3 IPUs
    assert c.to_dict() == before, "a rejected update must leave the config untouched"
    with pytest.raises(IncompatibleIPUConfigError, match="did you mean `device_iterations`"):
        c.update_from_string("device_iteration=2")
    with pytest.raises(IncompatibleIPUConfigError, match="has no '='"):
        c.update_from_string("seed")


def test_tensor_parallel_size_saves_loads_and_follows_the_mode(tmp_path):
    """Ours, beyond Optimum Graphcore: a mode-managed pair; its twin follows training unless given."""
    c = IPUConfig(layers_per_ipu=[2, 2], tensor_parallel_size=2)
    assert c.tensor_parallel_size == 2 and c.inference_tensor_parallel_size == 2, "the twin follows training"
    assert c.eval().tensor_parallel_size == 2 and c._tensor_parallel_size == 2 and c.device_slots == 4
    saved = json.loads(c.train().save_pretrained(tmp_path / "tp").read_text())
    assert saved["tensor_parallel_size"] == 2 and saved["inference_tensor_parallel_size"] == 2
    assert IPUConfig.from_pretrained(tmp_path / "tp") == c
    assert IPUConfig.from_dict(json.loads(c.to_json_string(use_diff=True))) == c

    own = IPUConfig(ipus_per_replica=2, tensor_parallel_size=4, inference_tensor_parallel_size=1)
    assert own.tensor_parallel_size == 4 and own.eval().tensor_parallel_size == 1 and own.device_slots == 2
    assert own.train().device_slots == 8 and own.value("tensor_parallel_size", inference=True) == 1
    loaded = IPUConfig.from_dict(own.to_dict())
    assert loaded == own and loaded.inference_tensor_parallel_size == 1, "a twin of 1 is written when training's is not"
    assert IPUConfig(inference_tensor_parallel_size=2).to_dict()["tensor_parallel_size"] == 1
    assert IPUConfig(tensor_parallel_size=2) != IPUConfig()

    # at 1 (both) neither key is written: Optimum Graphcore, which refuses unknown keys, loads the file
    assert not set(OWN_FIELD_DEFAULTS) & set(IPUConfig(layers_per_ipu=[2, 2]).to_dict())

    # writes in inference mode reach the twin; an update of the training value leaves the twin, as for any pair
    c = IPUConfig(layers_per_ipu=[2, 2])
    c.eval().tensor_parallel_size = 2
    assert c.inference_tensor_parallel_size == 2 and c.train().tensor_parallel_size == 1
    c.update_from_string("tensor_parallel_size=4")
    assert c.tensor_parallel_size == 4 and c.inference_tensor_parallel_size == 2
    c.eval()._tensor_parallel_size = 1
    assert c.inference_tensor_parallel_size == 1 and c.device_slots == 2

    # keyword-only: the positions of Optimum Graphcore's arguments are unchanged
    import inspect

    params = inspect.signature(IPUConfig.__init__).parameters
    assert params["tensor_parallel_size"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["inference_tensor_parallel_size"].kind is inspect.Parameter.KEYWORD_ONLY


BAD_CONFIGS = [
    ({"replication_factor": 0}, r"`replication_factor`: got 0; expected an integer >= 1"),
    ({"gradient_accumulation_steps": "4"}, r"`gradient_accumulation_steps`: got '4'; expected an integer"),
    ({"device_iterations": 1.5}, r"`device_iterations`: got 1.5"),
    ({"recompute_checkpoint_every_layer": 1}, r"`recompute_checkpoint_every_layer`: got 1; expected true or false"),
    ({"layers_per_ipu": [1, -2]}, r"`layers_per_ipu`.*>= -1"),
    ({"layers_per_ipu": "1,2"}, r"`layers_per_ipu`: got '1,2'; expected a non-empty list"),
    ({"layers_per_ipu": [1, 2], "ipus_per_replica": 3}, r"has 2 entries but `ipus_per_replica` is 3"),
    ({"matmul_proportion": 1.5}, r"`matmul_proportion`: got 1.5; expected a number in \(0, 1\]"),
    ({"matmul_proportion": [0.2], "ipus_per_replica": 2}, r"`matmul_proportion`.*has 1 entries"),
    ({"output_mode": "first"}, r"`output_mode`: got 'first'; expected one of 'all', 'sum', 'final', 'default'"),
    ({"seed": -1}, r"`seed`: got -1"),
    ({"ipus_per_replica": 2, "serialized_embedding_splits_per_ipu": [1, 1, 1]}, r"has 3 entries"),
    ({"layers_per_ipu": [-1] * 3, "serialized_projection_splits_per_ipu": [1, 0, 1]}, r"consecutive IPUs"),
    ({"embedding_serialization_factor": 2, "serialized_embedding_splits_per_ipu": [2]}, r"both given"),
    ({"parallelize_kwargs": [1]}, r"`parallelize_kwargs`: got \[1\]"),
    ({"executable_cache_dir": 3}, r"`executable_cache_dir`: got 3"),
    (
        {"tensor_parallel_size": 0},
        r"^IPUConfig field `tensor_parallel_size`: got 0; expected an integer >= 1 \(the devices that share each "
        r"pipeline stage's matrices; 1 for none\)\.$",
    ),
    ({"inference_tensor_parallel_size": "2"}, r"`inference_tensor_parallel_size`: got '2'; expected an integer >= 1"),
    ({"tensor_parallel_size": 4096}, r"`tensor_parallel_size`: got 4096; expected at most 1024"),
    ({"tensor_parallel_size": True}, r"`tensor_parallel_size`: got True; expected an integer >= 1"),
    ({"layers_per_ipus": [1]}, r"no field `layers_per_ipus`; did you mean `layers_per_ipu`"),
    ({"frobnicate": 1}, r"no field `frobnicate`; see docs/ipu-config.md"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_CONFIGS)
def test_bad_fields_name_field_value_and_fix(fields, message):
    with pytest.raises(IncompatibleIPUConfigError, match=message):
        IPUConfig.from_dict(fields)


def test_error_is_a_value_error():
    assert issubclass(IncompatibleIPUConfigError, ValueError)


def test_invalid_json_gives_line_and_column(tmp_path):
    path = tmp_path / "ipu_config.json"
    path.write_text('{\n  "seed": 1,\n  "layers_per_ipu": [1 2]\n}')
    with pytest.raises(IncompatibleIPUConfigError, match="not valid JSON: .* at line 3 column 24"):
        IPUConfig.from_pretrained(tmp_path)
    path.write_text("[1, 2]")
    with pytest.raises(IncompatibleIPUConfigError, match="must be a JSON object"):
        IPUConfig.from_pretrained(path)


def test_schema_fields_are_the_init_arguments():
    """`config_schema.FIELDS` is written out (so validation needs no `IPUConfig`): it must stay the signature's."""
    import inspect

    from optimum_ipu.config_schema import FIELDS

    params = inspect.signature(IPUConfig.__init__).parameters.items()
    names = [n for n, p in params if n not in ("self", "n_ipu") and p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert tuple(names) == FIELDS


def test_config_and_validation_import_each_other_not():
    """No cycle: validation imports `config` only for type annotations (under TYPE_CHECKING), never to run."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[1] / "optimum_ipu" / "config_validation.py").read_text())
    annotations_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
        for node in ast.walk(block)
    }
    to_config = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.level == 1
        and node.module == "config"
        and id(node) not in annotations_only
    ]
    assert not to_config, f"config_validation.py imports config at lines {to_config}"
    run = subprocess.run(
        [PYTHON, "-c", "import optimum_ipu.config_validation as v; print(len(v.known_keys()))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and int(run.stdout) > 30, run.stderr
