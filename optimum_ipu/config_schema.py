"""The `IPUConfig` schema: its field names and the constants both `config.py` and `config_validation.py` read.

Imported by both at module level, so neither imports the other's internals through function-level imports. No
torch, no I/O. `tests/test_config.py` checks `FIELDS` against `IPUConfig.__init__`.
"""

from __future__ import annotations

CONFIG_NAME = "ipu_config.json"

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
)

OUTPUT_MODES = ("all", "sum", "final", "default")

# Keys of older Graphcore files: accepted, one warning each, no effect of their own.
DEPRECATED_KEYS = {
    "enable_half_first_order_momentum": "optimizer state precision follows the training precision here",
    "sharded_execution_for_inference": "inference uses `inference_layers_per_ipu` / `inference_ipus_per_replica`",
    "pod_type": "per-pod values are resolved from `n_ipu` (the number of devices); "
    "`pod_type` is still honoured for this file",
}

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
)
