"""Optimum Graphcore users change one import line: their files, their `IPUConfig` calls, their helpers, their ids.

Expectations marked "OG" are taken from Optimum Graphcore's own tests (tests/test_ipu_configuration.py) and source
(optimum/graphcore/ipu_configuration.py, modeling_utils.py, tests/utils.py); the differences are in
docs/migrating.md.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig, bundled_config_ids, to_pipelined
from optimum_ipu import config as config_module
from optimum_ipu.modeling_utils import get_layer_ipu, shift_tokens_right, split_encoder_decoder_ipu_config
from optimum_ipu.models.generation import generate_static

from .helpers import generating_model

# What Optimum Graphcore's `IPUConfig(layers_per_ipu=[0, 4, 4, 4], gradient_accumulation_steps=16).save_pretrained()`
# writes: every attribute of its `__init__` and `BaseConfig.to_dict()`'s two version keys.
OG_SAVED = {
    "auto_loss_scaling": False,
    "device_iterations": 1,
    "embedding_serialization_factor": 1,
    "enable_half_partials": True,
    "executable_cache_dir": "",
    "execute_encoder_on_cpu_for_generation": False,
    "explicit_ir_inference": False,
    "gradient_accumulation_steps": 16,
    "inference_device_iterations": 1,
    "inference_embedding_serialization_factor": 1,
    "inference_ipus_per_replica": 4,
    "inference_layers_per_ipu": [0, 4, 4, 4],
    "inference_matmul_proportion": 0.2,
    "inference_parallelize_kwargs": {},
    "inference_projection_serialization_factor": 1,
    "inference_replication_factor": 1,
    "inference_serialized_embedding_splits_per_ipu": None,
    "inference_serialized_projection_splits_per_ipu": None,
    "ipus_per_replica": 4,
    "layers_per_ipu": [0, 4, 4, 4],
    "matmul_proportion": 0.2,
    "optimizer_state_offchip": False,
    "optimum_version": "1.6.1",
    "output_mode": "final",
    "parallelize_kwargs": {},
    "projection_serialization_factor": 1,
    "recompute_checkpoint_every_layer": False,
    "replicated_tensor_sharding": False,
    "replication_factor": 1,
    "seed": None,
    "serialized_embedding_splits_per_ipu": None,
    "serialized_projection_splits_per_ipu": None,
    "transformers_version": "4.29.2",
}

# The 25 ids of Optimum Graphcore's examples, notebooks and tests (`git grep -o "Graphcore/[a-z0-9.-]*-ipu"`), and
# the GroupBERT one its tests use as an IPU config.
OG_IDS = [
    *(
        f"Graphcore/{name}-ipu"
        for name in (
            "bart-base",
            "bert-base",
            "bert-large",
            "convnext-base",
            "deberta-base",
            "distilbert-base",
            "distilroberta-base",
            "gpt2-medium",
            "gpt2-small",
            "hubert-base",
            "internal-testing-tiny",
            "lxmert-base",
            "mpnet-base",
            "mt5-large",
            "mt5-small",
            "roberta-base",
            "roberta-large",
            "t5-large",
            "t5-small",
            "t5-xl",  # the Flan-T5 notebook's on 16 IPUs
            "vit-base",
            "wav2vec2-base",
            "wav2vec2-ctc-base",
            "wav2vec2-ctc-large",
            "wav2vec2-large",
            "whisper-tiny",
        )
    ),
    "Graphcore/groupbert-base-uncased",
]


@pytest.fixture(autouse=True)
def _fresh_warnings():
    config_module.logger.warning_once.cache_clear()
    yield
    config_module.logger.warning_once.cache_clear()


# ------------------------------------------------------------------------------------------- files and keys
def test_a_file_saved_by_optimum_graphcore_loads_and_saves_back_with_its_keys(tmp_path):
    (tmp_path / "ipu_config.json").write_text(json.dumps(OG_SAVED, indent=2, sort_keys=True))
    config = IPUConfig.from_pretrained(tmp_path)
    assert config.layers_per_ipu == [0, 4, 4, 4] and config.gradient_accumulation_steps == 16
    assert config.execute_encoder_on_cpu_for_generation is False
    saved = json.loads(config.save_pretrained(tmp_path / "again").read_text())
    assert saved == OG_SAVED, "every key kept, the metadata as read"
    assert config == IPUConfig(layers_per_ipu=[0, 4, 4, 4], gradient_accumulation_steps=16), "metadata is no field"


def test_files_of_older_releases_load(tmp_path, caplog):
    """Keys that Optimum Graphcore 0.1-0.6 wrote (its `to_dict()` was the object's `__dict__`)."""
    v0_1 = {"layers_per_ipu": [2, 2], "random_seed": 7, "use_popdist": False, "compile_only": False}
    v0_1 |= {"synthetic_data": False, "profile_dir": None, "replication_factor": 2}
    v0_3 = {"layers_per_ipu": [4], "decompose_grad_sum": False, "sharded_execution_for_inference": True}
    v0_6 = {**OG_SAVED, "_mode": "training"}
    with caplog.at_level(logging.WARNING, logger="optimum_ipu.config"):
        old = IPUConfig.from_dict(v0_1)
        IPUConfig.from_dict(v0_3)
        newer = IPUConfig.from_dict(v0_6)
    assert old.seed == 7 and old.replication_factor == 2 and newer.mode == "training"
    reported = " ".join(r.message for r in caplog.records)
    for key in ("use_popdist", "compile_only", "synthetic_data", "profile_dir", "decompose_grad_sum"):
        assert f"`{key}` is deprecated" in reported, key
    assert IPUConfig.from_dict({"random_seed": 1, "seed": 2}).seed == 2, "the field's own key wins"


def test_from_pretrained_takes_the_loading_options_of_optimum_graphcores_examples(tmp_path):
    """Its example scripts call `IPUConfig.from_pretrained(name, cache_dir=..., revision=..., use_auth_token=...)`."""
    options = {"cache_dir": str(tmp_path / "cache"), "revision": "main", "use_auth_token": None, "token": None}
    assert IPUConfig.from_pretrained("Graphcore/roberta-large-ipu", **options).layers_per_ipu == [3, 7, 7, 7]
    (tmp_path / "model" / "ipu").mkdir(parents=True)
    IPUConfig(layers_per_ipu=[2, 2]).save_pretrained(tmp_path / "model" / "ipu")
    assert IPUConfig.from_pretrained(tmp_path / "model", subfolder="ipu").ipus_per_replica == 2
    # a fine-tuned model's id in the cache folder given (cache_dir=), at the revision asked for
    repo = tmp_path / "cache" / "models--someorg--bert-squad"
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "snapshots" / "abc" / "ipu_config.json").write_text(json.dumps({**OG_SAVED, "seed": 5}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    assert IPUConfig.from_pretrained("someorg/bert-squad", **options).seed == 5
    with pytest.raises(IncompatibleIPUConfigError, match="no IPU config found"):
        IPUConfig.from_pretrained("someorg/bert-squad", cache_dir=options["cache_dir"], revision="v2")
    config, unused = IPUConfig.from_pretrained("Graphcore/bert-base-ipu", return_unused_kwargs=True, foo=1, seed=3)
    assert unused == {"foo": 1} and config.seed == 3
    with pytest.raises(IncompatibleIPUConfigError, match="no field `foo`"):
        IPUConfig.from_pretrained("Graphcore/bert-base-ipu", foo=1)


def test_to_dict_has_optimum_graphcores_keys():
    assert set(IPUConfig().to_dict()) == set(OG_SAVED)
    # OG's own test round-trips `to_dict()` through `from_dict` with `execute_encoder_on_cpu_for_generation` set
    d = IPUConfig().to_dict()
    d["output_mode"], d["execute_encoder_on_cpu_for_generation"] = "sum", False
    assert IPUConfig.from_dict(d).output_mode == "sum"


def test_metadata_is_no_field_to_update_and_must_be_a_version():
    config = IPUConfig()
    with pytest.raises(IncompatibleIPUConfigError, match="`optimum_version` is not a field that can be updated"):
        config.update_from_string("optimum_version=1.0")
    with pytest.raises(IncompatibleIPUConfigError, match="`transformers_version`: got 4"):
        IPUConfig.from_dict({"transformers_version": 4})


def test_execute_encoder_on_cpu_is_kept_and_reported_once(caplog):
    with caplog.at_level(logging.WARNING, logger="optimum_ipu.config"):
        config = IPUConfig(execute_encoder_on_cpu_for_generation=True)
        IPUConfig(execute_encoder_on_cpu_for_generation=True)
    assert config.to_dict()["execute_encoder_on_cpu_for_generation"] is True
    assert sum("execute_encoder_on_cpu_for_generation" in r.message for r in caplog.records) == 1


def test_parallelize_kwargs_realised_or_reported_once_by_name(caplog):
    # the inference knobs of Optimum Graphcore's Whisper fine-tuning notebook
    knobs = {"use_cache": True, "use_encoder_output_buffer": True, "on_device_generation_steps": 16}
    with caplog.at_level(logging.WARNING, logger="optimum_ipu.config"):
        IPUConfig(inference_parallelize_kwargs=knobs)
        IPUConfig(inference_parallelize_kwargs=knobs, parallelize_kwargs={"use_cache": False})
    messages = [r.message for r in caplog.records]
    assert len(messages) == 2, messages
    assert "`inference_parallelize_kwargs` key 'on_device_generation_steps' has no effect" in messages[0]
    assert "`parallelize_kwargs` key 'use_cache' has no effect" in messages[1]  # training has no generation


def test_inference_parallelize_kwargs_are_defaults_of_the_static_generation():
    model = generating_model("GPT2LMHeadModel")
    ids = torch.randint(2, 50, (2, 5), generator=torch.Generator().manual_seed(0))
    want = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=2, max_length=12, do_sample=False)
    knobs = {"num_beams": 2, "max_length": 12, "batch_size": 4}
    pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=[2, 2], inference_parallelize_kwargs=knobs))
    torch.testing.assert_close(generate_static(pipelined, ids, do_sample=False), want)
    no_cache = to_pipelined(model, IPUConfig(inference_parallelize_kwargs={**knobs, "use_cache": False}))
    torch.testing.assert_close(generate_static(no_cache, ids, do_sample=False), want)
    # the call's own arguments win (None is not given, as Seq2SeqTrainer passes it)
    shorter = generate_static(pipelined, ids, do_sample=False, max_new_tokens=2, num_beams=None)
    assert shorter.shape[1] == ids.shape[1] + 2
    # a stock model and the config apart, as IPUSeq2SeqTrainer and pipeline() call it
    config = IPUConfig(inference_parallelize_kwargs=knobs)
    torch.testing.assert_close(generate_static(model, ids, do_sample=False, ipu_config=config), want)


# ------------------------------------------------------------------------------------------------ the API
def test_pretrained_config_methods_optimum_graphcore_inherited(tmp_path):
    config = IPUConfig()
    config.update({"gradient_accumulation_steps": 8, "seed": 1})
    assert config.gradient_accumulation_steps == 8 and config.seed == 1
    with pytest.raises(IncompatibleIPUConfigError, match="no field `gradient_acumulation_steps`"):
        config.update({"gradient_acumulation_steps": 8})
    diff = json.loads(config.to_json_string(use_diff=True))
    fields = {k: v for k, v in diff.items() if not k.endswith("_version")}
    assert fields == {"gradient_accumulation_steps": 8, "seed": 1}
    config.to_json_file(tmp_path / "diff.json", use_diff=True)
    assert IPUConfig.from_pretrained(tmp_path / "diff.json") == config
    with pytest.raises(IncompatibleIPUConfigError, match="poptorch options exist only on IPUs"):
        config.to_options(for_inference=True)


def test_mode_is_settable_and_checked():  # OG: test_mode_set
    config = IPUConfig(layers_per_ipu=[1, 1], inference_layers_per_ipu=[2])
    assert IPUConfig.modes == ("training", "inference") and config.mode == "training"
    config.mode = "inference"
    assert config._layers_per_ipu == [2] and config._ipus_per_replica == 1
    config.mode = "training"
    assert config._layers_per_ipu == [1, 1]
    with pytest.raises(ValueError, match="`IPUConfig` mode can only take"):
        config.mode = "invalid"


def test_attribute_default_values():  # OG: test_attribute_default_values
    assert IPUConfig(layers_per_ipu=[1, 2, 3]).ipus_per_replica == 3
    mp = [0.1, 0.2, 0.3, 0.4]
    assert IPUConfig(layers_per_ipu=[1, 2, 3, 4], matmul_proportion=mp).inference_matmul_proportion == mp
    config = IPUConfig(layers_per_ipu=[1, 2, 3, 4], matmul_proportion=mp, inference_layers_per_ipu=[3, 7])
    assert config.inference_matmul_proportion == 0.2
    assert IPUConfig(ipus_per_replica=10).inference_ipus_per_replica == 10
    assert IPUConfig(ipus_per_replica=10, inference_layers_per_ipu=[1, 2, 3]).inference_ipus_per_replica == 3
    config = IPUConfig()
    assert config.projection_serialization_factor == config.inference_projection_serialization_factor == 1
    assert config.embedding_serialization_factor == config.inference_embedding_serialization_factor == 1
    # OG's inference serialization is its own (default 1), not the training one
    assert IPUConfig(embedding_serialization_factor=4).inference_embedding_serialization_factor == 1


@pytest.mark.parametrize("mode", IPUConfig.modes)
@pytest.mark.parametrize(
    ("attr", "value"),
    [
        ("layers_per_ipu", [1, 2, 3, 4]),
        ("matmul_proportion", 0.6),
        ("ipus_per_replica", 4),
        ("serialized_projection_splits_per_ipu", [4]),
        ("serialized_embedding_splits_per_ipu", [4]),
        ("projection_serialization_factor", 4),
        ("embedding_serialization_factor", 4),
    ],
)
def test_attr_mode_retrieval(attr, value, mode):  # OG: test_attr_mode_retrieval
    helper = IPUConfig()
    helper.mode = mode
    config = IPUConfig(**{helper._get_managed_attr_mode_name(attr): value})
    config.mode = mode
    assert getattr(config, f"_{attr}") == value


def test_batch_size_factor():  # OG: _test_batch_size_factor
    config = IPUConfig(
        replication_factor=2,
        inference_replication_factor=3,
        gradient_accumulation_steps=5,
        device_iterations=7,
        inference_device_iterations=11,
    )
    assert config.batch_size_factor() == 2 * 5 * 7 and config.batch_size_factor(for_inference=True) == 3 * 11
    assert config.eval().batch_size_factor() == 2 * 5 * 7, "for_inference defaults to False whatever the mode"


@pytest.mark.parametrize("mode", IPUConfig.modes)
@pytest.mark.parametrize(
    ("attr", "value"),
    [
        ("layers_per_ipu", [-2]),
        ("replication_factor", 0),
        ("gradient_accumulation_steps", 0),
        ("ipus_per_replica", 0),
        ("embedding_serialization_factor", 0),
        ("device_iterations", 0),
        ("projection_serialization_factor", 0),
        ("serialized_embedding_splits_per_ipu", [0, 2, 2, -1]),
        ("serialized_projection_splits_per_ipu", [0, 0]),
        ("serialized_projection_splits_per_ipu", [0, 3, 0, 2]),
        ("output_mode", "invalid"),
    ],
)
def test_values_refused_when_set(attr, value, mode):  # OG: the attribute validators, run on setattr
    config = IPUConfig()
    config.mode = mode
    name = config._get_managed_attr_mode_name(attr)
    before = config.to_dict()
    with pytest.raises(IncompatibleIPUConfigError, match=f"`{name}`"):
        setattr(config, name, value)
    assert config.to_dict() == before


@pytest.mark.parametrize("prefix", ["", "inference_"])
def test_incoherent_configs_are_refused(prefix):  # OG: test_validate_ipu_config
    bad = [
        {"ipus_per_replica": 4, "matmul_proportion": [0.2] * 5},
        {"ipus_per_replica": 4, "layers_per_ipu": [2] * 5},
        {"projection_serialization_factor": 2, "serialized_projection_splits_per_ipu": [1, 1]},
        {"embedding_serialization_factor": 2, "serialized_embedding_splits_per_ipu": [1, 1]},
        {"ipus_per_replica": 8, "serialized_projection_splits_per_ipu": [0, 0, 1, 1]},
        {"ipus_per_replica": 8, "serialized_embedding_splits_per_ipu": [0, 0, 1, 1]},
    ]
    for fields in bad:
        with pytest.raises(IncompatibleIPUConfigError):
            IPUConfig(**{f"{prefix}{k}": v for k, v in fields.items()})


# ------------------------------------------------------------------------------- modeling_utils helpers
def test_get_layer_ipu():  # OG: test_layers_per_ipu
    assert get_layer_ipu(IPUConfig(layers_per_ipu=[1, 2]), 3) == [0, 1, 1]
    assert get_layer_ipu(IPUConfig(layers_per_ipu=[1, 2])) == [0, 1, 1]
    for wrong in (2, 4):
        with pytest.raises(IncompatibleIPUConfigError, match="does not define the correct number of layers"):
            get_layer_ipu(IPUConfig(layers_per_ipu=[1, 2]), wrong)
    with pytest.raises(IncompatibleIPUConfigError, match="layers_per_ipu"):  # OG refused it in get_layer_ipu
        IPUConfig(layers_per_ipu=[1, -1], ipus_per_replica=4)
    assert get_layer_ipu(IPUConfig(), 9) == [0] * 9
    assert get_layer_ipu(IPUConfig(ipus_per_replica=2), 6) == [0, 0, 0, 1, 1, 1]
    assert get_layer_ipu(IPUConfig(ipus_per_replica=2), 7) == [0, 0, 0, 1, 1, 1, 1]
    assert get_layer_ipu(IPUConfig(layers_per_ipu=[2, -1]), 6) == [0, 0, 1, 1, 1, 1]
    assert get_layer_ipu(IPUConfig(layers_per_ipu=[-1, 2]), 6) == [0, 0, 0, 0, 1, 1]
    assert get_layer_ipu(IPUConfig(layers_per_ipu=[-1, 2, -1, 2]), 7) == [0, 1, 1, 2, 2, 3, 3]
    # OG's remainder rule: all of it on the last wildcard IPU; a list of layers counts its length
    assert get_layer_ipu(IPUConfig(ipus_per_replica=4), list(range(14))) == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 5


@pytest.mark.parametrize("mode", IPUConfig.modes)
def test_get_layer_ipu_wildcard_in_each_mode(mode):  # OG: test_layers_per_ipu_wildcard
    helper = IPUConfig()
    helper.mode = mode
    config = IPUConfig(
        **{helper._get_managed_attr_mode_name(k): v for k, v in {"ipus_per_replica": 4, "layers_per_ipu": [-1]}.items()}
    )
    config.mode = mode
    assert config._ipus_per_replica == 4 and get_layer_ipu(config, 8) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_split_encoder_decoder_ipu_config():  # OG: test_split_encoder_decoder_ipu_config
    encoder, decoder = split_encoder_decoder_ipu_config(IPUConfig(layers_per_ipu=[1, 2]), 1, 2)
    assert (encoder.layers_per_ipu, encoder.ipus_per_replica, decoder.layers_per_ipu) == ([1], 1, [2])
    config = IPUConfig(layers_per_ipu=[2, 2, 2, 2], matmul_proportion=[0.1, 0.2, 0.3, 0.4])
    encoder, decoder = split_encoder_decoder_ipu_config(config, 4, 4)
    assert encoder.matmul_proportion == [0.1, 0.2] and decoder.matmul_proportion == [0.3, 0.4]
    skip = ("layers_per_ipu", "ipus_per_replica", "matmul_proportion")
    for key, value in config.to_dict().items():
        if not any(s in key for s in skip):
            assert encoder.to_dict()[key] == value == decoder.to_dict()[key], key
    for kind in ("projection", "embedding"):
        bad = IPUConfig(layers_per_ipu=[0, 2, 2, 0], **{f"serialized_{kind}_splits_per_ipu": [0, 2, 2, 0]})
        with pytest.raises(ValueError, match="must have all splits placed on the"):
            split_encoder_decoder_ipu_config(bad, 2, 2)
    encoder, decoder = split_encoder_decoder_ipu_config(IPUConfig(layers_per_ipu=[-1, -1]), 2, 3)
    assert encoder.layers_per_ipu == [2] and decoder.layers_per_ipu == [3]
    with pytest.raises(IncompatibleIPUConfigError, match="does not define the correct number of layers"):
        split_encoder_decoder_ipu_config(IPUConfig(layers_per_ipu=[1, 2]), 2, 2)
    with pytest.raises(IncompatibleIPUConfigError, match="Unable to find a valid split"):
        split_encoder_decoder_ipu_config(IPUConfig(layers_per_ipu=[4, 3]), 3, 4)
    with pytest.raises(IncompatibleIPUConfigError, match="at least 2 to split"):
        split_encoder_decoder_ipu_config(IPUConfig(layers_per_ipu=[4]), 2, 2)
    cases = [
        ([1, 2, 3, 0, 5, 6, 7, 8], 6, 26, [1, 2, 3, 0], [5, 6, 7, 8]),
        ([0, 6, 0, 6], 6, 6, [0, 6], [0, 6]),
        ([3, 0, 3, 0, 0, 7], 6, 7, [3, 0, 3, 0], [0, 7]),
    ]
    for layers, n_encoder, n_decoder, want_encoder, want_decoder in cases:
        encoder, decoder = split_encoder_decoder_ipu_config(IPUConfig(layers_per_ipu=layers), n_encoder, n_decoder)
        assert (encoder.layers_per_ipu, encoder.ipus_per_replica) == (want_encoder, len(want_encoder))
        assert (decoder.layers_per_ipu, decoder.ipus_per_replica) == (want_decoder, len(want_decoder))


@pytest.mark.parametrize("mode", IPUConfig.modes)
def test_split_encoder_decoder_in_each_mode(mode):  # OG: IPUConfigExecutionModeTester.test_split_...
    fields = {
        "layers_per_ipu": [1, 2, 3, 4],
        "matmul_proportion": [0.1, 0.2, 0.3, 0.4],
        "ipus_per_replica": 4,
        "serialized_projection_splits_per_ipu": [0, 0, 2, 2],
        "serialized_embedding_splits_per_ipu": [2, 2, 0, 0],
    }
    config = IPUConfig(**{(f"inference_{k}" if mode == "inference" else k): v for k, v in fields.items()})
    config.mode = mode
    encoder, decoder = split_encoder_decoder_ipu_config(config, 3, 7)
    assert (encoder._layers_per_ipu, encoder._ipus_per_replica, encoder._matmul_proportion) == ([1, 2], 2, [0.1, 0.2])
    assert encoder._serialized_projection_splits_per_ipu is None
    assert encoder._serialized_embedding_splits_per_ipu == [2, 2] and encoder._embedding_serialization_factor == 4
    assert (decoder._layers_per_ipu, decoder._ipus_per_replica, decoder._matmul_proportion) == ([3, 4], 2, [0.3, 0.4])
    assert decoder._serialized_projection_splits_per_ipu == [2, 2]
    assert decoder._serialized_embedding_splits_per_ipu is None and decoder._embedding_serialization_factor == 1


def test_shift_tokens_right():
    labels = torch.tensor([[5, 6, -100], [7, -100, -100]])
    assert shift_tokens_right(labels, pad_token_id=0, decoder_start_token_id=2).tolist() == [[2, 5, 6], [2, 7, 0]]


def test_helpers_also_at_the_top_level():
    import optimum_ipu

    assert optimum_ipu.get_layer_ipu is get_layer_ipu
    assert optimum_ipu.split_encoder_decoder_ipu_config is split_encoder_decoder_ipu_config


# ------------------------------------------------------------------------------------------- ids offline
def test_the_bundled_ids_are_optimum_graphcores():
    assert sorted(bundled_config_ids()) == sorted(OG_IDS)


@pytest.mark.parametrize("config_id", OG_IDS)
def test_every_graphcore_id_loads_offline(config_id):
    assert config_id in bundled_config_ids()
    config = IPUConfig.from_pretrained(config_id)
    assert len(config.layers_per_ipu) == config.ipus_per_replica
    assert IPUConfig.from_dict(config.to_dict()) == config


# pipeline layers of each id's model (encoder + decoder for seq2seq; LXMERT: its 9 language layers)
LAYERS = {
    "bart-base": (6, 6),
    "t5-small": (6, 6),
    "t5-large": (24, 24),
    "t5-xl": (24, 24),
    "mt5-small": (8, 8),
    "mt5-large": (24, 24),
    "whisper-tiny": (4, 4),
    **dict.fromkeys(["bert-base", "roberta-base", "deberta-base", "mpnet-base", "vit-base", "gpt2-small"], 12),
    **dict.fromkeys(["hubert-base", "wav2vec2-base", "wav2vec2-ctc-base", "groupbert-base-uncased"], 12),
    **dict.fromkeys(["bert-large", "roberta-large", "gpt2-medium", "wav2vec2-large", "wav2vec2-ctc-large"], 24),
    **dict.fromkeys(["distilbert-base", "distilroberta-base"], 6),
    "lxmert-base": 9,
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_each_bundled_layout_fits_its_model(name):
    config = IPUConfig.from_pretrained(f"Graphcore/{name}" if name.endswith("uncased") else f"Graphcore/{name}-ipu")
    layers = LAYERS[name]
    total = sum(layers) if isinstance(layers, tuple) else layers
    for mode in IPUConfig.modes:
        config.mode = mode
        assert len(get_layer_ipu(config, total)) == total
        if isinstance(layers, tuple) and config._ipus_per_replica > 1:  # the encoder and decoder on their own IPUs
            encoder, decoder = split_encoder_decoder_ipu_config(config, *layers)
            assert len(get_layer_ipu(encoder, layers[0])) == layers[0]
            assert len(get_layer_ipu(decoder, layers[1])) == layers[1]


def test_optimum_graphcores_test_overrides_of_mt5_small():  # OG: tests/utils.py
    translation = IPUConfig.from_pretrained(
        "Graphcore/mt5-small-ipu",
        embedding_serialization_factor=None,
        serialized_embedding_splits_per_ipu=[4, 4, 0, 0],
        layers_per_ipu=[0, 0, 16, 0],
    )
    assert translation.embedding_serialization_factor == 8 and translation.layers_per_ipu == [0, 0, 16, 0]
    summarization = IPUConfig.from_pretrained(
        "Graphcore/mt5-small-ipu",
        ipus_per_replica=8,
        layers_per_ipu=[0, 1, 2, 2, 5, 6, 0, 0],
        embedding_serialization_factor=None,
        projection_serialization_factor=None,
        serialized_embedding_splits_per_ipu=[4, 4, 0, 0, 0, 0, 0, 0],
        serialized_projection_splits_per_ipu=[0, 0, 0, 0, 0, 0, 4, 4],
    )
    assert summarization.ipus_per_replica == 8 and summarization.inference_ipus_per_replica == 4
    assert summarization.projection_serialization_factor == 8


def test_modeling_utils_annotations_import_and_say_once(caplog):
    """The external_model notebook's `recomputation_checkpoint` (and `outline_attribute`) import and run as there,
    said once; poptorch's module replacements are one-line import errors naming what does their job here."""
    from optimum_ipu.modeling_utils import _said_once, outline_attribute, recomputation_checkpoint

    _said_once.cache_clear()
    layer = torch.nn.Linear(3, 3)
    expected = layer(torch.ones(1, 3))
    with caplog.at_level("WARNING"):
        handles = [recomputation_checkpoint(layer) for _ in range(2)]
        outline_attribute(layer, "A")
    torch.testing.assert_close(layer(torch.ones(1, 3)), expected)  # nothing changed
    for handle in handles:
        handle.remove()
    assert caplog.text.count("recomputation_checkpoint: poptorch's graph annotation") == 1
    assert caplog.text.count("outline_attribute: poptorch's graph annotation") == 1
    with pytest.raises(ImportError, match=r"SerializedEmbedding: .*embedding_serialization_factor=N"):
        from optimum_ipu.modeling_utils import SerializedEmbedding  # noqa: F401
