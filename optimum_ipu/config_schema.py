"""The `IPUConfig` schema: its field names and the constants both `config.py` and `config_validation.py` read, and
the two pure steps from a file's values to the fields (`upgrade_older_keys`, `fill_defaults`).

Imported by both at module level, so neither imports the other's internals through function-level imports. No
torch, no I/O. `tests/test_config.py` checks `FIELDS` against `IPUConfig.__init__`.
"""

from __future__ import annotations

import copy
from typing import Any

CONFIG_NAME = "ipu_config.json"

# `IPUConfig.modes`, as in Optimum Graphcore: the plain name of a mode-managed field reads its training value in
# "training" mode and its `inference_*` twin in "inference" mode.
MODES = ("training", "inference")

# Metadata keys that Optimum Graphcore's `save_pretrained` writes in every file (`optimum.configuration_utils`).
# Accepted on load, kept as read and written back on save; no field, no effect, out of `==`.
METADATA_KEYS = ("optimum_version", "transformers_version")

# Fields that have an `inference_*` twin: in `eval()` mode, reading or writing the plain name
# reaches the twin. `gradient_accumulation_steps` has none (inference accumulates nothing).
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
    "tensor_parallel_size",
)

OUTPUT_MODES = ("all", "sum", "final", "default")

# Keys of older Graphcore files: accepted, one warning each, no effect of their own.
DEPRECATED_KEYS = {
    "enable_half_first_order_momentum": "optimizer state precision follows the training precision here",
    "sharded_execution_for_inference": "inference uses `inference_layers_per_ipu` / `inference_ipus_per_replica`",
    "pod_type": "per-pod values are resolved from `n_ipu` (the number of devices); "
    "`pod_type` is still honoured for this file",
    # written by Optimum Graphcore 0.1-0.3 (poptorch run options, later training arguments or gone)
    "compile_only": "compilation without running is `--compile_only` of the training arguments",
    "use_popdist": "processes are started by torchrun here",
    "synthetic_data": "poptorch's synthetic data mode has no counterpart here",
    "profile_dir": "poptorch's profiler has no counterpart here (use torch.profiler)",
    "decompose_grad_sum": "a PopART graph option, no counterpart here",
}

# Keys of older Optimum Graphcore files that hold a field under another name (0.1-0.2 wrote `random_seed`); the
# field's own key wins when a file has both.
LEGACY_NAMES = {"random_seed": "seed"}

# The state of the process that saved the file, not a setting (0.6.1 wrote its mode as `_mode`): dropped on load.
SAVED_STATE_KEYS = ("_mode", "_attribute_type_hints")

# IPU-compiler memory knobs: kept in the file, no meaning on GPUs or CPUs.
IPU_ONLY_FIELDS = ("matmul_proportion", "inference_matmul_proportion", "explicit_ir_inference")

# Every field of `IPUConfig`, in the order of its `__init__` (`n_ipu` is an argument, not a field).
FIELDS = (
    "replication_factor",
    "inference_replication_factor",
    "gradient_accumulation_steps",
    "layers_per_ipu",
    "inference_layers_per_ipu",
    "ipus_per_replica",
    "inference_ipus_per_replica",
    "optimizer_state_offchip",
    "replicated_tensor_sharding",
    "matmul_proportion",
    "inference_matmul_proportion",
    "enable_half_partials",
    "embedding_serialization_factor",
    "inference_embedding_serialization_factor",
    "serialized_embedding_splits_per_ipu",
    "inference_serialized_embedding_splits_per_ipu",
    "projection_serialization_factor",
    "inference_projection_serialization_factor",
    "serialized_projection_splits_per_ipu",
    "inference_serialized_projection_splits_per_ipu",
    "recompute_checkpoint_every_layer",
    "device_iterations",
    "inference_device_iterations",
    "output_mode",
    "seed",
    "auto_loss_scaling",
    "executable_cache_dir",
    "explicit_ir_inference",
    "parallelize_kwargs",
    "inference_parallelize_kwargs",
    "execute_encoder_on_cpu_for_generation",
    "tensor_parallel_size",
    "inference_tensor_parallel_size",
)

# Fields of ours, beyond Optimum Graphcore's, with the value that means "as Optimum Graphcore": `to_dict()` writes
# them only when one differs from it, so a file saved here for a layout Optimum Graphcore can run loads there too
# (its `IPUConfig` refuses unknown keys) and a file of theirs saves back with its own keys.
OWN_FIELD_DEFAULTS = {"tensor_parallel_size": 1, "inference_tensor_parallel_size": 1}

# Keys of `parallelize_kwargs` / `inference_parallelize_kwargs` (Optimum Graphcore passed them to the model's
# `parallelize()`). Realised here: the inference ones become defaults of the static-cache generation
# (`optimum_ipu.models.generation.generate_static`): `use_cache` (False: no KV cache), `num_beams`, `max_length`
# and `batch_size` (the rows the batch is padded to, the KV cache's batch). One is ours: `sequence_buckets`, the
# sequence lengths `pipeline()` pads token inputs to and `IPUTrainer.evaluate` / `predict` cut padded batches to
# (`optimum_ipu.runtime.inference.runner.default_buckets` when absent). `use_group_quantized_linears` (True: the
# linear weights of the model's layers stored in int8, one scale per group of inputs, by torchao:
# `optimum_ipu.runtime.quantization`) is realised by `parallelize(use_group_quantized_linears=True)` and, as this
# key, by `pipeline()` (as its `quantize=True`); `IPUTrainer` keeps the weights it trains.
PARALLELIZE_KWARGS_REALISED = (
    "use_cache",
    "num_beams",
    "max_length",
    "batch_size",
    "sequence_buckets",
    "use_group_quantized_linears",
)
# What these asked Optimum Graphcore for is what `transformers`' generation does anyway: the encoder runs once per
# `generate()` and its output is kept (`use_encoder_output_buffer`), the cross-attention keys and values are
# computed once and cached at the encoder's length (`use_cross_cache`, `encoder_max_length`).
PARALLELIZE_KWARGS_BUILT_IN = ("use_encoder_output_buffer", "use_cross_cache", "encoder_max_length")
# The rest has no counterpart here and is reported once by name, with the reason.
PARALLELIZE_KWARGS_REPORTED = {
    "on_device_generation_steps": "each generated token is one step of transformers' decoding loop (there is "
    "no host/device split of the loop to batch tokens over)",
    "batch_serialization_factor": "attention is not computed in batch chunks here (pass a smaller batch_size)",
    "sequence_serialization_factor": "attention is not computed in sequence chunks here",
    "use_cond_encoder": "the encoder and the decoder share the model's device already",
}

# Loading options of `from_pretrained` (`PretrainedConfig`'s, which Optimum Graphcore's examples pass): `cache_dir`,
# `revision` and `subfolder` say where to look; the others concern downloading, and nothing is downloaded here.
HUB_LOADING_KWARGS = ("cache_dir", "revision", "subfolder")
DOWNLOAD_KWARGS = (
    "token",
    "use_auth_token",
    "force_download",
    "local_files_only",
    "proxies",
    "resume_download",
    "trust_remote_code",
    "_from_pipeline",
    "_from_auto",
    "_commit_hash",
)

# `inference_matmul_proportion` when the training one does not fit the inference layout (Optimum Graphcore's)
DEFAULT_MATMUL_PROPORTION = 0.2


def upgrade_older_keys(config_dict: dict[str, Any]) -> dict[str, Any]:
    """Keys of older Optimum Graphcore files: a field's older name becomes the field (unless the file has both),
    the saving process's state (`_mode`) is dropped."""
    upgraded = {}
    for key, value in config_dict.items():
        if key in SAVED_STATE_KEYS or (key in LEGACY_NAMES and LEGACY_NAMES[key] in config_dict):
            continue
        upgraded[LEGACY_NAMES.get(key, key)] = value
    return upgraded


def fill_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """Derive the defaults that depend on other fields, with Optimum Graphcore's rules (`IPUConfig.__init__` and
    `_validate_ipu_config` there): the inference layout follows the training one (and so does our
    `inference_tensor_parallel_size`); nothing else is inherited."""
    v = dict(values)
    if v["layers_per_ipu"] is None:
        v["layers_per_ipu"] = [-1]
    layers = v["layers_per_ipu"]
    if v["inference_layers_per_ipu"] is None:
        v["inference_layers_per_ipu"] = copy.deepcopy(layers)
    if v["ipus_per_replica"] is None:
        v["ipus_per_replica"] = len(layers)
    if v["inference_ipus_per_replica"] is None:
        # the inference layout's length, unless it is the bare wildcard and `ipus_per_replica` was given apart
        inference = v["inference_layers_per_ipu"]
        own_length = v["ipus_per_replica"] == len(layers) or inference != [-1]
        v["inference_ipus_per_replica"] = len(inference) if own_length else v["ipus_per_replica"]
    for prefix in ("", "inference_"):
        ipus = v[f"{prefix}ipus_per_replica"]
        if v[f"{prefix}layers_per_ipu"] == [-1] and isinstance(ipus, int) and ipus > 1:
            v[f"{prefix}layers_per_ipu"] = [-1] * ipus  # the wildcard on every slot
        # Serialization: splits given -> the factor is their sum; neither given -> factor 1.
        for kind in ("embedding", "projection"):
            factor, splits = f"{prefix}{kind}_serialization_factor", f"{prefix}serialized_{kind}_splits_per_ipu"
            if v[factor] is None and isinstance(v[splits], list) and all(isinstance(s, int) for s in v[splits]):
                v[factor] = sum(v[splits])
            elif v[factor] is None:
                v[factor] = 1
    if v["inference_matmul_proportion"] is None:
        # per-IPU proportions that do not fit the inference layout fall back to the default, 0.2
        mp = v["matmul_proportion"]
        fits = not isinstance(mp, list) or len(mp) == v["inference_ipus_per_replica"]
        v["inference_matmul_proportion"] = copy.deepcopy(mp) if fits else DEFAULT_MATMUL_PROPORTION
    if v["inference_tensor_parallel_size"] is None:  # ours: follows training, as `inference_ipus_per_replica` does
        v["inference_tensor_parallel_size"] = v["tensor_parallel_size"]
    v["parallelize_kwargs"] = v["parallelize_kwargs"] or {}
    v["inference_parallelize_kwargs"] = v["inference_parallelize_kwargs"] or {}
    return v
