"""Hypothesis strategies for `ipu_config.json` contents: valid configs, and malformed ones with the field their
error must name. Shared by tests/test_config_properties.py and tests/reliability/test_bad_configs.py.

The lists of fields below are written out here, not imported from `optimum_ipu`: the tests' idea of what is
valid must not come from the code under test.
"""

from __future__ import annotations

import string
from typing import Any

from hypothesis import strategies as st

POSITIVE_INT_FIELDS = (
    "replication_factor",
    "inference_replication_factor",
    "gradient_accumulation_steps",
    "ipus_per_replica",
    "inference_ipus_per_replica",
    "embedding_serialization_factor",
    "inference_embedding_serialization_factor",
    "projection_serialization_factor",
    "inference_projection_serialization_factor",
    "device_iterations",
    "inference_device_iterations",
)
BOOL_FIELDS = (
    "optimizer_state_offchip",
    "replicated_tensor_sharding",
    "enable_half_partials",
    "recompute_checkpoint_every_layer",
    "auto_loss_scaling",
    "explicit_ir_inference",
)
OUTPUT_MODES = ("all", "sum", "final", "default")
# Fields with an `inference_*` twin: in inference mode, `update_from_string("x=...")` reaches the twin.
MODE_MANAGED_FIELDS = (
    "replication_factor",
    "layers_per_ipu",
    "ipus_per_replica",
    "matmul_proportion",
    "device_iterations",
    "embedding_serialization_factor",
    "serialized_embedding_splits_per_ipu",
    "projection_serialization_factor",
    "serialized_projection_splits_per_ipu",
    "parallelize_kwargs",
)
POD_FIELDS = ("replication_factor", "inference_replication_factor", "gradient_accumulation_steps", "device_iterations")
MAX_SEED = 2**32 - 1
# Counts far above any pod are refused before anything is built from them (a list per device slot...).
MAX_IPUS_PER_REPLICA, MAX_COUNT = 1024, 2**20
# Names Python itself would trip over in `IPUConfig(**fields)`, or that are no field.
RESERVED_KEYS = ("self", "kwargs", "cls", "__init__", "__dict__", "mode")

Malformed = tuple[dict[str, Any], tuple[str, ...], dict[str, Any]]  # fields, names the error must contain, kwargs


def _splits(n: int) -> st.SearchStrategy[list[int]]:
    """Per-IPU serialization splits: non-zero entries on consecutive IPUs."""

    @st.composite
    def build(draw) -> list[int]:
        start = draw(st.integers(0, n - 1))
        length = draw(st.integers(1, n - start))
        used = draw(st.lists(st.integers(1, 3), min_size=length, max_size=length))
        return [0] * start + used + [0] * (n - start - length)

    return build()


def _layers(n: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(-1, 4), min_size=n, max_size=n)


@st.composite
def valid_config_dicts(draw) -> dict[str, Any]:
    """The contents of a valid `ipu_config.json`: an explicit training layout plus any subset of the other fields."""
    ipus = draw(st.integers(1, 4))
    d: dict[str, Any] = {"ipus_per_replica": ipus, "layers_per_ipu": draw(_layers(ipus))}
    maybe = st.booleans()
    for field, values in (
        ("replication_factor", st.integers(1, 4)),
        ("inference_replication_factor", st.integers(1, 4)),
        ("gradient_accumulation_steps", st.integers(1, 16)),
        ("device_iterations", st.integers(1, 4)),
        ("inference_device_iterations", st.integers(1, 4)),
        ("matmul_proportion", st.floats(0.01, 1.0) | st.lists(st.floats(0.01, 1.0), min_size=ipus, max_size=ipus)),
        ("output_mode", st.sampled_from(OUTPUT_MODES)),
        ("seed", st.none() | st.integers(0, MAX_SEED)),
        ("executable_cache_dir", st.text(string.ascii_letters + "/._-", max_size=12)),
        ("parallelize_kwargs", st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3), max_size=2)),
        *((field, st.booleans()) for field in BOOL_FIELDS),
    ):
        if draw(maybe):
            d[field] = draw(values)
    for kind in ("embedding", "projection"):
        choice = draw(st.sampled_from(["none", "factor", "splits"]))
        if choice == "factor":
            d[f"{kind}_serialization_factor"] = draw(st.integers(1, 4))
        elif choice == "splits":
            d[f"serialized_{kind}_splits_per_ipu"] = draw(_splits(ipus))
    if draw(maybe):  # an inference layout of its own
        k = draw(st.integers(1, 4))
        d["inference_ipus_per_replica"], d["inference_layers_per_ipu"] = k, draw(_layers(k))
    if draw(maybe):  # a per-pod value, as Graphcore's files have, always with a default
        field = draw(st.sampled_from(POD_FIELDS))
        d[field] = {"pod4": draw(st.integers(1, 4)), "pod16": draw(st.integers(1, 4)), "default": 1}
    return d


def _with(d: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**d, **changes}


@st.composite
def malformed_configs(draw) -> Malformed:
    """A valid config with one thing broken, and what the error must name (the field, or the key)."""
    d = draw(valid_config_dicts())
    ipus = d["ipus_per_replica"]
    kind = draw(
        st.sampled_from(
            [
                "wrong_type",
                "not_positive",
                "bool",
                "layers_below",
                "layers_length",
                "inference_layers_length",
                "matmul",
                "splits",
                "both_serializations",
                "output_mode",
                "seed",
                "unknown_key",
                "pod_missing",
                "parallelize",
                "cache_dir",
                "n_ipu",
                "pod_type",
                "too_large",
                "reserved_key",
                "deep_kwargs",
                "huge_value",
            ]
        )
    )
    if kind == "wrong_type":
        field = draw(st.sampled_from(POSITIVE_INT_FIELDS))
        return _with(d, **{field: draw(st.sampled_from(["4", 2.5, True, [1], {"x": 1}]))}), (f"`{field}`",), {}
    if kind == "not_positive":
        field = draw(st.sampled_from(POSITIVE_INT_FIELDS))
        return _with(d, **{field: draw(st.integers(-5, 0))}), (f"`{field}`",), {}
    if kind == "bool":
        field = draw(st.sampled_from(BOOL_FIELDS))
        return _with(d, **{field: draw(st.sampled_from([0, 1, "true", None, [True]]))}), (f"`{field}`",), {}
    if kind == "layers_below":
        layers = list(d["layers_per_ipu"])
        layers[draw(st.integers(0, ipus - 1))] = draw(st.integers(-10, -2))
        return _with(d, layers_per_ipu=layers), ("`layers_per_ipu`",), {}
    if kind in ("layers_length", "inference_layers_length"):
        prefix = "inference_" if kind.startswith("inference") else ""
        slots = d.get(f"{prefix}ipus_per_replica", ipus)
        length = draw(st.integers(1, 6).filter(lambda n: n != slots))
        layers = draw(_layers(length).filter(lambda v: v != [-1]))  # [-1] alone is repeated on every IPU
        return (
            _with(d, **{f"{prefix}ipus_per_replica": slots, f"{prefix}layers_per_ipu": layers}),
            (f"`{prefix}layers_per_ipu`", f"`{prefix}ipus_per_replica`"),
            {},
        )
    if kind == "matmul":
        value = draw(st.sampled_from([0, -0.1, 1.5, "0.2", [], True, [0.2] * (ipus + 1)]))
        return _with(d, matmul_proportion=value), ("`matmul_proportion`",), {}
    if kind == "splits":
        which = draw(st.sampled_from(["embedding", "projection"]))
        bad = [[1] * (ipus + 1), [0] * ipus, [-1] + [1] * (ipus - 1), "2,2", [1.5] * ipus]
        if ipus >= 3:
            bad.append([1] + [0] * (ipus - 2) + [1])  # not on consecutive IPUs
        fields = {k: v for k, v in d.items() if k != f"{which}_serialization_factor"}
        field = f"serialized_{which}_splits_per_ipu"
        return _with(fields, **{field: draw(st.sampled_from(bad))}), (f"`{field}`",), {}
    if kind == "both_serializations":
        which = draw(st.sampled_from(["embedding", "projection"]))
        factor, splits = f"{which}_serialization_factor", f"serialized_{which}_splits_per_ipu"
        return _with(d, **{factor: 2, splits: [2] + [0] * (ipus - 1)}), (f"`{factor}`", f"`{splits}`"), {}
    if kind == "output_mode":
        mode = draw(st.text(string.ascii_lowercase, min_size=1, max_size=6).filter(lambda m: m not in OUTPUT_MODES))
        return _with(d, output_mode=mode), ("`output_mode`",), {}
    if kind == "seed":
        return _with(d, seed=draw(st.sampled_from([-1, MAX_SEED + 1, "1", 1.5, True]))), ("`seed`",), {}
    if kind == "unknown_key":
        from optimum_ipu.config import DEPRECATED_KEYS, FIELDS

        known = {*FIELDS, *DEPRECATED_KEYS, "n_ipu"}
        base = draw(st.sampled_from(sorted(known)))
        cut = draw(st.integers(0, len(base) - 1))
        key = draw(
            st.sampled_from([base[:cut] + base[cut + 1 :], base + "s", "x" + base]).filter(lambda k: k not in known)
        )
        return _with(d, **{key: 1}), (f"`{key}`",), {}
    if kind == "pod_missing":
        field = draw(st.sampled_from(POD_FIELDS))
        n_ipu = draw(st.sampled_from([None, 8, 64]))
        return (
            _with(d, **{field: {"pod4": 1, "pod16": 4}}),
            (f"`{field}`",),
            ({} if n_ipu is None else {"n_ipu": n_ipu}),
        )
    if kind == "parallelize":
        return _with(d, parallelize_kwargs=draw(st.sampled_from([[1], "a", 3, True]))), ("`parallelize_kwargs`",), {}
    if kind == "cache_dir":
        return (
            _with(d, executable_cache_dir=draw(st.sampled_from([3, None, [], True]))),
            ("`executable_cache_dir`",),
            {},
        )
    if kind == "n_ipu":
        return d, ("`n_ipu`",), {"n_ipu": draw(st.sampled_from([0, -2, "4", 2.5, True]))}
    if kind == "too_large":
        field = draw(st.sampled_from(POSITIVE_INT_FIELDS))
        limit = MAX_IPUS_PER_REPLICA if field.endswith("ipus_per_replica") else MAX_COUNT
        return _with(d, **{field: draw(st.integers(limit + 1, 10**40) | st.just(1_000_000_000))}), (f"`{field}`",), {}
    if kind == "reserved_key":
        key = draw(st.sampled_from(RESERVED_KEYS))
        return _with(d, **{key: draw(st.sampled_from([1, "x", None]))}), (f"`{key}`",), {}
    if kind == "deep_kwargs":
        value: Any = draw(st.sampled_from([1, "x", [1]]))
        for _ in range(draw(st.integers(9, 60))):
            value = {"k": value} if draw(st.booleans()) else [value]
        return _with(d, parallelize_kwargs={"cache": value}), ("`parallelize_kwargs`",), {}
    if kind == "huge_value":  # echoed back at most ~200 characters (the test checks the message's length)
        field = draw(st.sampled_from(["output_mode", "gradient_accumulation_steps", "seed", "layers_per_ipu"]))
        text = draw(st.sampled_from(string.ascii_letters)) * draw(st.integers(1_000, 200_000))
        return _with(d, **{field: text}), (f"`{field}`",), {}
    assert kind == "pod_type"
    return _with(d, pod_type=draw(st.sampled_from([["pod4"], 4, "pod", {"a": 1}]))), ("`pod_type`",), {}


@st.composite
def bad_override_strings(draw) -> tuple[str, tuple[str, ...]]:
    """An `--ipu_config_overrides` string with one mistake, and what its error must name."""
    kind = draw(st.sampled_from(["value", "layers", "typo", "no_equals", "no_key", "not_a_field"]))
    if kind == "value":
        field = draw(st.sampled_from(POSITIVE_INT_FIELDS))
        return f"{field}={draw(st.sampled_from(['0', '-3', 'two', '1.5', '[1', 'true']))}", (f"`{field}`",)
    if kind == "layers":
        return f"layers_per_ipu=[1 {draw(st.integers(-9, -2))}]", ("`layers_per_ipu`",)
    if kind == "typo":
        key = draw(st.sampled_from(["gradient_acumulation_steps", "layers_per_ipus", "replicaton_factor", "sed"]))
        return f"{key}=2", (f"`{key}`",)
    if kind == "no_equals":
        word = draw(st.sampled_from(["seed", "device_iterations 2", "layers_per_ipu:[1]"]))
        return f"gradient_accumulation_steps=2,{word}", (repr(word), "'='")
    if kind == "no_key":
        return "=4", ("'=4'",)
    key = draw(st.sampled_from(["n_ipu", "pod_type"]))
    return f"{key}=4", (f"`{key}`",)
