"""Property-based: what holds for every valid `IPUConfig` (loading, round trips, modes, derived sizes, updates).

Malformed configs and arguments are in tests/reliability/test_bad_configs.py.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from optimum_ipu import IPUConfig
from optimum_ipu.config import FIELDS
from optimum_ipu.config_schema import METADATA_KEYS, OWN_FIELD_DEFAULTS
from optimum_ipu.models.layout import layers_per_stage

from .reliability.config_strategies import MODE_MANAGED_FIELDS, POD_FIELDS, valid_config_dicts

SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(fields=valid_config_dicts())
def test_valid_config_loads_and_round_trips(fields, tmp_path_factory):
    config = IPUConfig.from_dict(fields)
    assert set(config.to_dict()) == {*FIELDS, *METADATA_KEYS} - set(OWN_FIELD_DEFAULTS)  # ours: written when not 1
    assert IPUConfig.from_dict(config.to_dict()) == config
    assert IPUConfig.from_dict(json.loads(config.to_json_string())) == config
    folder = tmp_path_factory.mktemp("round-trip", numbered=True)
    config.save_pretrained(folder)
    assert IPUConfig.from_pretrained(folder) == config
    # the fields given are kept as given (per-pod values resolve to their default)
    for key, value in fields.items():
        expected = value["default"] if isinstance(value, dict) and key in POD_FIELDS else value
        assert config.value(key.removeprefix("inference_"), inference=key.startswith("inference_")) == expected, key


@SETTINGS
@given(fields=valid_config_dicts())
def test_modes_sizes_and_layers(fields):
    config = IPUConfig.from_dict(fields)
    raw = config.to_dict()
    for inference in (False, True):
        config.train(not inference)
        prefix = "inference_" if inference else ""
        for name in MODE_MANAGED_FIELDS:  # the plain name reads the current mode's twin
            if name.endswith("_factor") and raw[f"{prefix}{name}"] is None:
                continue  # a factor implied by per-IPU splits is written as null
            assert getattr(config, name) == raw[f"{prefix}{name}"] == config.value(name, inference=inference)
        ipus, replicas = raw[f"{prefix}ipus_per_replica"], raw[f"{prefix}replication_factor"]
        assert len(config.layers_per_ipu) == ipus and config.device_slots == ipus * replicas
        factor = replicas * raw[f"{prefix}device_iterations"] * (1 if inference else raw["gradient_accumulation_steps"])
        assert config.batch_size_factor(for_inference=inference) == factor
        fixed, wildcards = sum(n for n in config.layers_per_ipu if n != -1), config.layers_per_ipu.count(-1)
        # a wildcard asks for a layer at least, as a count does: one each, and 3 more to share
        layers = layers_per_stage(config, fixed + wildcards + 3 if wildcards else fixed)
        assert len(layers) == ipus and min(layers) >= 0
    assert config.train().mode == "training" and config.eval().mode == "inference"


@SETTINGS
@given(fields=valid_config_dicts(), other=valid_config_dicts(), inference=st.booleans())
def test_update_from_string_sets_what_it_says(fields, other, inference):
    """Scalar fields of another valid config, written as `key=value` text, land on this config unchanged."""
    config = IPUConfig.from_dict(fields).train(not inference)
    source = IPUConfig.from_dict(other).to_dict()
    keys = [
        "gradient_accumulation_steps",
        "device_iterations",
        "replication_factor",
        "output_mode",
        "seed",
        "recompute_checkpoint_every_layer",
        "auto_loss_scaling",
    ]
    update = ",".join(f"{k}={source[k] if isinstance(source[k], str) else json.dumps(source[k])}" for k in keys)
    config.update_from_string(update)
    for key in keys:
        twin = f"inference_{key}" if inference and key in MODE_MANAGED_FIELDS else key
        assert config.to_dict()[twin] == source[key], key
    assert config.mode == ("inference" if inference else "training")


@SETTINGS
@given(
    values=st.dictionaries(st.sampled_from(["pod4", "pod8", "pod16", "pod64"]), st.integers(1, 8), min_size=1),
    default=st.integers(1, 8),
    n_ipu=st.sampled_from([None, 4, 8, 16, 32, 64]),
)
def test_per_pod_values_resolve_by_pod_size(values, default, n_ipu):
    config = IPUConfig(replication_factor={**values, "default": default}, n_ipu=n_ipu)
    assert config.replication_factor == values.get(f"pod{n_ipu}", default)
