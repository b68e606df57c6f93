"""Property-based: any malformed config gives one IncompatibleIPUConfigError, never a deeper exception."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig
from optimum_ipu.config import FIELDS

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 40) | st.floats(-2, 2, allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
keys = st.sampled_from([*FIELDS, "pod_type", "n_ipu", "layers_per_ipus", "bogus"])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, json_values, max_size=6))
def test_any_config_is_valid_or_one_clear_error(fields):
    try:
        config = IPUConfig.from_dict(fields)
    except IncompatibleIPUConfigError as err:
        assert "`" in str(err) or "IPUConfig" in str(err)
        return
    # a config that loads round-trips and resolves against a model, or says clearly why not
    assert IPUConfig.from_dict(config.to_dict()) == config
    try:
        config.layers_per_stage(12)
    except IncompatibleIPUConfigError as err:
        assert "layers_per_ipu" in str(err)
