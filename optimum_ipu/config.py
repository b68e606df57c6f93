"""`IPUConfig`: how a model is laid out and executed on a pod of devices.

Pure Python and JSON: this module imports no torch (a test checks it), so a config can be
written, validated and inspected anywhere. What each field becomes on real hardware is
decided by `optimum_ipu.runtime`; the table lives in docs/ipu-config.md and in DESIGN.md.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

from transformers.utils.logging import get_logger

from .config_hub import push_config_to_hub
from .config_schema import (
    CONFIG_NAME,
    DEPRECATED_KEYS,
    DOWNLOAD_KWARGS,
    FIELDS,
    HUB_LOADING_KWARGS,
    IPU_ONLY_FIELDS,
    METADATA_KEYS,
    MODE_MANAGED_FIELDS,
    MODES,
    OWN_FIELD_DEFAULTS,
    PARALLELIZE_KWARGS_BUILT_IN,
    PARALLELIZE_KWARGS_REALISED,
    PARALLELIZE_KWARGS_REPORTED,
    fill_defaults,
    upgrade_older_keys,
)
from .config_validation import (
    AUTO_LAYERS,
    check_exclusive_serialization,
    check_field_types,
    check_linked_file_keys,
    check_metadata,
    check_unknown_keys,
    known_keys,
    locate_config_file,
    parse_update_string,
    read_json,
    resolve_pod_values,
    take_auto_layers,
    validate,
)
from .errors import IncompatibleIPUConfigError, short_repr
from .files import write_text_atomic

logger = get_logger(__name__)  # transformers' (no torch): `warning_once`, once a message per process


class _ModeManaged:
    """Descriptor: `config.<name>` reads/writes `<name>` in training mode, `inference_<name>` in inference mode.

    Also under Optimum Graphcore's private names (`config._layers_per_ipu`, ...), which its models and helpers read.
    """

    def __init__(self, field: str | None = None) -> None:
        self.name = field

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    def _key(self, obj: IPUConfig) -> str:
        return f"inference_{self.name}" if obj.__dict__.get("mode") == "inference" else self.name

    def __get__(self, obj: IPUConfig | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return obj.__dict__[self._key(obj)]

    def __set__(self, obj: IPUConfig, value: Any) -> None:
        obj._set_field(self._key(obj), value)


class IPUConfig:
    r"""
    Execution configuration of a model on a pod of devices, stored as `ipu_config.json`.

    An "IPU" is one device slot: one pipeline stage of one replica (or, with `tensor_parallel_size` > 1, one
    tensor-parallel share of a stage). With fewer devices than slots the stages share a device and run in turn,
    with the same numbers. Every field of Graphcore's `IPUConfig` is accepted with its meaning and default, so
    their published files load as they are.

    Args:
        replication_factor (`int`, *optional*, defaults to 1):
            Number of data-parallel replicas of the pipelined model.
        inference_replication_factor (`int`, *optional*, defaults to 1):
            Same as `replication_factor`, for evaluation, prediction and `pipeline()`.
        gradient_accumulation_steps (`int`, *optional*, defaults to 1):
            Micro-batches per optimizer step. In a pipeline these are the schedule's micro-batches.
        layers_per_ipu (`List[int]`, *optional*, defaults to `[-1]`):
            Number of transformer layers on each device slot of a replica. `-1` is a wildcard: the layers
            not placed explicitly are shared out evenly between wildcards (the remainder goes to the last
            ones). Embeddings sit with slot 0; heads are placed by the model's stage plan. `"auto"` (with
            `ipus_per_replica` stages): balanced from each layer's measured cost when the model is parallelized.
        inference_layers_per_ipu (`List[int]`, *optional*):
            Same as `layers_per_ipu` for inference; defaults to `layers_per_ipu`.
        ipus_per_replica (`int`, *optional*):
            Device slots per replica; defaults to `len(layers_per_ipu)`. With `layers_per_ipu=[-1]`, the
            wildcard is repeated on every slot.
        inference_ipus_per_replica (`int`, *optional*):
            Same as `ipus_per_replica` for inference; defaults to `ipus_per_replica` (or to the length of
            `inference_layers_per_ipu` when that is given).
        optimizer_state_offchip (`bool`, *optional*, defaults to `False`):
            Keep the optimizer state in host memory.
        replicated_tensor_sharding (`bool`, *optional*, defaults to `False`):
            Shard the optimizer state over replicas (ZeRO-1 / FSDP2). No effect with one replica.
        matmul_proportion (`float` or `List[float]`, *optional*, defaults to 0.2):
            IPU compiler memory knob. Kept in the file; it has no effect on GPUs or CPUs.
        inference_matmul_proportion (`float` or `List[float]`, *optional*):
            Same for inference; defaults to `matmul_proportion`. No effect here.
        enable_half_partials (`bool`, *optional*, defaults to `True`):
            Let matmul partial sums be accumulated in half precision when training in half precision
            (reduced-precision reductions on CUDA).
        embedding_serialization_factor (`int`, *optional*, defaults to 1):
            Compute the vocabulary embedding in this many chunks, to bound peak memory.
        inference_embedding_serialization_factor (`int`, *optional*, defaults to 1):
            Same as `embedding_serialization_factor`, for inference. Not inherited from training, as in Optimum
            Graphcore.
        serialized_embedding_splits_per_ipu (`List[int]`, *optional*):
            Chunks of the embedding placed on each slot, e.g. `[2, 2, 0, 0]`; the non-zero entries must be
            on consecutive slots. Mutually exclusive with `embedding_serialization_factor`, which then
            becomes their sum.
        inference_serialized_embedding_splits_per_ipu (`List[int]`, *optional*):
            Same as `serialized_embedding_splits_per_ipu`, for inference.
        projection_serialization_factor (`int`, *optional*, defaults to 1):
            Compute the output projection onto the vocabulary (and its loss) in this many chunks.
        inference_projection_serialization_factor (`int`, *optional*, defaults to 1):
            Same as `projection_serialization_factor`, for inference. Not inherited from training, as in Optimum
            Graphcore.
        serialized_projection_splits_per_ipu (`List[int]`, *optional*):
            Like `serialized_embedding_splits_per_ipu`, for the output projection.
        inference_serialized_projection_splits_per_ipu (`List[int]`, *optional*):
            Same as `serialized_projection_splits_per_ipu`, for inference. With the stages on separate processes,
            their placement is real in an evaluation that keeps the loss alone: each stage computes the logits of its
            share of the vocabulary (its splits over their sum; `[1, 1]`: half each) and the cross-entropy is
            combined from the shares, so the output projection no longer sits on the last stage alone.
        recompute_checkpoint_every_layer (`bool`, *optional*, defaults to `False`):
            Activation checkpointing of every transformer layer: recompute activations in the backward
            pass instead of storing them.
        device_iterations (`int`, *optional*, defaults to 1):
            Optimizer steps run per host call: the loader hands over that many global batches at once.
        inference_device_iterations (`int`, *optional*, defaults to 1):
            Batches run per host call in inference.
        output_mode (`str`, *optional*, defaults to `"final"`):
            What a host call returns of its iterations: `"all"`, `"sum"`, `"final"` or `"default"`
            (`"all"` in inference, `"final"` in training).
        seed (`int`, *optional*):
            Seed of the random number generators.
        auto_loss_scaling (`bool`, *optional*, defaults to `False`):
            Dynamic loss scaling in fp16: lower the scale and skip the step on overflow, raise it after a
            run of good steps.
        executable_cache_dir (`str`, *optional*, defaults to `""`):
            Folder of a persistent cache of compiled graphs, so that a second run starts fast.
        explicit_ir_inference (`bool`, *optional*, defaults to `False`):
            IPU compiler switch. Kept in the file; it has no effect here.
        parallelize_kwargs (`Dict[str, Any]`, *optional*):
            Keyword arguments passed to the model's `parallelize()` in training.
        inference_parallelize_kwargs (`Dict[str, Any]`, *optional*):
            Same for inference.
        execute_encoder_on_cpu_for_generation (`bool`, *optional*, defaults to `False`):
            Optimum Graphcore's switch (never implemented there: its `to_options` refused `True`). Kept in the
            file; `True` is reported once and the encoder runs on the model's device.
        n_ipu (`int`, *optional*):
            Number of devices of the pod, used only to resolve per-pod values such as
            `{"pod4": 1, "pod16": 4, "default": 1}` (key `pod{n_ipu}`, else `default`). Not stored.
        tensor_parallel_size (`int`, *optional*, defaults to 1):
            Devices per pipeline stage of each replica, sharing each layer's matrices through
            `torch.distributed.tensor.parallel`. Ours, beyond Optimum Graphcore (keyword-only; written to the file
            only when it or its twin is not 1, so the files of other layouts still load there). The tensor-parallel
            group is the innermost axis `tp` of the device mesh, beside `dp` (replicas) and `pp` (stages): a job has
            `ipus_per_replica x replication_factor x tensor_parallel_size` device slots.
        inference_tensor_parallel_size (`int`, *optional*):
            Same as `tensor_parallel_size`, for inference; defaults to `tensor_parallel_size`.
        kwargs:
            Optimum Graphcore's metadata keys `optimum_version` and `transformers_version` (kept as read and
            written back on save; no effect) and the deprecated keys of older files (one warning each).

    Example:

    ```python
    >>> from optimum_ipu import IPUConfig
    >>> config = IPUConfig(layers_per_ipu=[0, 4, 4, 4], gradient_accumulation_steps=16)
    >>> config.ipus_per_replica, config.batch_size_factor()
    (4, 16)
    ```
    """

    CONFIG_NAME = CONFIG_NAME
    modes = MODES

    replication_factor = _ModeManaged()
    layers_per_ipu = _ModeManaged()
    ipus_per_replica = _ModeManaged()
    matmul_proportion = _ModeManaged()
    device_iterations = _ModeManaged()
    embedding_serialization_factor = _ModeManaged()
    serialized_embedding_splits_per_ipu = _ModeManaged()
    projection_serialization_factor = _ModeManaged()
    serialized_projection_splits_per_ipu = _ModeManaged()
    parallelize_kwargs = _ModeManaged()
    tensor_parallel_size = _ModeManaged()
    # Optimum Graphcore's names: there only these follow the mode (its plain names always read training values); ours
    # (`_tensor_parallel_size`) follows the same pattern
    _replication_factor = _ModeManaged("replication_factor")
    _layers_per_ipu = _ModeManaged("layers_per_ipu")
    _ipus_per_replica = _ModeManaged("ipus_per_replica")
    _matmul_proportion = _ModeManaged("matmul_proportion")
    _device_iterations = _ModeManaged("device_iterations")
    _embedding_serialization_factor = _ModeManaged("embedding_serialization_factor")
    _serialized_embedding_splits_per_ipu = _ModeManaged("serialized_embedding_splits_per_ipu")
    _projection_serialization_factor = _ModeManaged("projection_serialization_factor")
    _serialized_projection_splits_per_ipu = _ModeManaged("serialized_projection_splits_per_ipu")
    _parallelize_kwargs = _ModeManaged("parallelize_kwargs")
    _tensor_parallel_size = _ModeManaged("tensor_parallel_size")

    def __init__(
        self,
        replication_factor: int = 1,
        inference_replication_factor: int = 1,
        gradient_accumulation_steps: int = 1,
        layers_per_ipu: list[int] | None = None,
        inference_layers_per_ipu: list[int] | None = None,
        ipus_per_replica: int | None = None,
        inference_ipus_per_replica: int | None = None,
        optimizer_state_offchip: bool = False,
        replicated_tensor_sharding: bool = False,
        matmul_proportion: float | list[float] = 0.2,
        inference_matmul_proportion: float | list[float] | None = None,
        enable_half_partials: bool = True,
        embedding_serialization_factor: int | None = None,
        inference_embedding_serialization_factor: int | None = None,
        serialized_embedding_splits_per_ipu: list[int] | None = None,
        inference_serialized_embedding_splits_per_ipu: list[int] | None = None,
        projection_serialization_factor: int | None = None,
        inference_projection_serialization_factor: int | None = None,
        serialized_projection_splits_per_ipu: list[int] | None = None,
        inference_serialized_projection_splits_per_ipu: list[int] | None = None,
        recompute_checkpoint_every_layer: bool = False,
        device_iterations: int = 1,
        inference_device_iterations: int = 1,
        output_mode: str = "final",
        seed: int | None = None,
        auto_loss_scaling: bool = False,
        executable_cache_dir: str = "",
        explicit_ir_inference: bool = False,
        parallelize_kwargs: dict[str, Any] | None = None,
        inference_parallelize_kwargs: dict[str, Any] | None = None,
        execute_encoder_on_cpu_for_generation: bool = False,
        n_ipu: int | None = None,
        *,  # ours, beyond Optimum Graphcore: keyword-only, so the positions of its arguments stay as they were
        tensor_parallel_size: int = 1,
        inference_tensor_parallel_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        pod_type = kwargs.get("pod_type")
        for key in kwargs:
            if key in DEPRECATED_KEYS:
                logger.warning_once(f"IPUConfig: `{key}` is deprecated and ignored: {DEPRECATED_KEYS[key]}.")
        check_unknown_keys([k for k in kwargs if k not in DEPRECATED_KEYS and k not in METADATA_KEYS])
        metadata = {k: kwargs[k] for k in METADATA_KEYS if k in kwargs}
        check_metadata(metadata)

        given = dict(locals())
        values = {name: given[name] for name in (*FIELDS, "n_ipu")}
        values = resolve_pod_values(values, n_ipu=n_ipu, pod_type=pod_type)
        check_exclusive_serialization(values)
        auto_layers = take_auto_layers(values)  # "auto" layouts: even wildcards until parallelize measures
        check_field_types(values, allow_none=True)  # before deriving defaults from them
        self.__dict__["mode"] = "training"
        self.__dict__["auto_layers"] = auto_layers
        self.__dict__["metadata"] = metadata
        for name, value in fill_defaults(values).items():
            self.__dict__[name] = copy.deepcopy(value)
        validate(self.__dict__)
        _report_parallelize_kwargs(self.__dict__)
        if self.__dict__["execute_encoder_on_cpu_for_generation"]:
            logger.warning_once(
                "IPUConfig: `execute_encoder_on_cpu_for_generation` has no effect here (Optimum Graphcore never "
                "implemented it either): the encoder runs on the model's device.",
            )

    def __setattr__(self, name: str, value: Any) -> None:
        """Fields are checked when set, as in Optimum Graphcore (type and range; the layout is checked on load)."""
        if name in FIELDS and name not in MODE_MANAGED_FIELDS:
            self._set_field(name, value)
        else:  # `mode`, the mode-managed names (their descriptor checks the field reached), other attributes
            object.__setattr__(self, name, value)

    def _set_field(self, name: str, value: Any, keep_auto: bool = False) -> None:
        """Set a field, checked; a layout set so is no longer `"auto"` unless `keep_auto` (the balanced split)."""
        check_field_types({**self.__dict__, name: value})
        self.__dict__[name] = value
        if not keep_auto:
            self.__dict__["auto_layers"] = tuple(f for f in self.__dict__.get("auto_layers", ()) if f != name)

    def _get_managed_attr_mode_name(self, attr: str) -> str:
        """The field that the mode-managed `attr` reaches in the current mode (Optimum Graphcore's helper)."""
        managed = attr in MODE_MANAGED_FIELDS
        return f"inference_{attr}" if managed and self.mode == "inference" else attr

    # ------------------------------------------------------------------ modes
    def train(self, mode: bool = True) -> IPUConfig:
        """Switch to training mode (or to inference mode with `mode=False`), like `nn.Module.train`."""
        self.__dict__["mode"] = "training" if mode else "inference"
        return self

    def eval(self) -> IPUConfig:
        """Switch to inference mode: every field with an `inference_*` twin now reads the twin."""
        return self.train(False)

    @property
    def mode(self) -> str:
        """`"training"` or `"inference"` (`IPUConfig.modes`); settable, as `train()` and `eval()` do."""
        return self.__dict__["mode"]

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in MODES:
            raise IncompatibleIPUConfigError(
                f"`IPUConfig` mode can only take values in {MODES}; got {short_repr(value)}. Use `train()` / `eval()`."
            )
        self.__dict__["mode"] = value

    def value(self, name: str, inference: bool = False) -> Any:
        """A field's training value (or its `inference_*` twin's), whatever the current mode."""
        twin = f"inference_{name}"
        return self.__dict__[twin if inference and twin in self.__dict__ else name]

    # ------------------------------------------------------------ derived sizes
    def batch_size_factor(self, for_inference: bool = False) -> int:
        """Samples per host call divided by the per-device micro-batch size.

        Args:
            for_inference (`bool`, defaults to `False`):
                Training (whatever the mode, as in Optimum Graphcore):
                `replication_factor * gradient_accumulation_steps * device_iterations`.
                Inference: `inference_replication_factor * inference_device_iterations`.
        """
        if for_inference:
            return self.__dict__["inference_replication_factor"] * self.__dict__["inference_device_iterations"]
        return (
            self.__dict__["replication_factor"]
            * self.__dict__["gradient_accumulation_steps"]
            * self.__dict__["device_iterations"]
        )

    @property
    def device_slots(self) -> int:
        """Device slots of the current mode, one process each under `torchrun`:
        `ipus_per_replica * replication_factor * tensor_parallel_size` (`inference_*` values after `eval()`)."""
        return self.ipus_per_replica * self.replication_factor * self.tensor_parallel_size

    def ipu_only_fields_set(self) -> list[str]:
        """IPU compiler knobs of this config that differ from their defaults (they have no effect here)."""
        default = IPUConfig()
        return [f for f in IPU_ONLY_FIELDS if self.__dict__[f] != default.__dict__[f]]

    # -------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        """All fields, training and inference values alike, whatever the mode, and the metadata keys: the keys of
        Optimum Graphcore's `to_dict()`.

        A serialization factor implied by per-IPU splits is written as `null`, so the file loads back. Our fields
        beyond Optimum Graphcore's (`tensor_parallel_size` and its twin) are written only when one is not 1, so the
        file of a layout Optimum Graphcore can run loads there too (it refuses unknown keys). The metadata is kept as
        read; a config made here writes the installed `transformers` version and `optimum_version: null`.
        """
        at_default = all(self.__dict__[name] == value for name, value in OWN_FIELD_DEFAULTS.items())
        d = {
            name: copy.deepcopy(self.__dict__[name])
            for name in FIELDS
            if not (at_default and name in OWN_FIELD_DEFAULTS)
        }
        for prefix in ("", "inference_"):
            for kind in ("embedding", "projection"):
                if d[f"{prefix}serialized_{kind}_splits_per_ipu"] is not None:
                    d[f"{prefix}{kind}_serialization_factor"] = None
        d.update(dict.fromkeys(self.__dict__.get("auto_layers", ()), AUTO_LAYERS))
        metadata = self.__dict__["metadata"]
        d["optimum_version"] = metadata.get("optimum_version")
        d["transformers_version"] = metadata.get("transformers_version") or _installed_version("transformers")
        return d

    def to_json_string(self, use_diff: bool = False) -> str:
        """The config as JSON text; with `use_diff` (as in `transformers`), only the values that differ from
        `IPUConfig()`'s, and the metadata."""
        d = self.to_dict()
        if use_diff:
            default = IPUConfig().to_dict()  # has no key of ours (`OWN_FIELD_DEFAULTS`): written ones are kept
            d = {k: v for k, v in d.items() if k in METADATA_KEYS or k not in default or v != default[k]}
        return json.dumps(d, indent=2, sort_keys=True) + "\n"

    def to_json_file(self, json_file_path: str | os.PathLike, use_diff: bool = False) -> None:
        """Write the config as JSON atomically: a reader never sees a half-written file."""
        write_text_atomic(json_file_path, self.to_json_string(use_diff=use_diff))

    def update(self, config_dict: dict[str, Any]) -> None:
        """Set the fields of `config_dict` (`transformers`' `PretrainedConfig.update`), each checked as it is set."""
        unknown = [k for k in config_dict if k not in FIELDS]
        check_unknown_keys(unknown)
        for key, value in config_dict.items():
            setattr(self, key, value)

    def to_options(self, for_inference: bool = False, compile_only: bool = False) -> Any:
        """Optimum Graphcore's `poptorch.Options`: there is no poptorch here; refused in one line."""
        raise IncompatibleIPUConfigError(
            "IPUConfig.to_options(): poptorch options exist only on IPUs; here the config is used as it is "
            "(to_pipelined(model, ipu_config), IPUTrainer(..., ipu_config=...), pipeline(..., ipu_config=...))"
        )

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs: Any) -> Path:
        """Save as `save_directory/ipu_config.json` (the folder is created if needed); returns the file's path.

        With `push_to_hub=True`, also upload it, as `transformers`' `save_pretrained` does: `repo_id` defaults to
        the folder's name; `kwargs` are `push_to_hub`'s (`repo_id`, `token`, `private`, `commit_message`, ...).
        """
        path = self._save_file(save_directory)
        if push_to_hub:
            repo_id = kwargs.pop("repo_id", Path(save_directory).name)
            self.push_to_hub(repo_id, **kwargs)
        return path

    def push_to_hub(
        self,
        repo_id: str,
        commit_message: str | None = None,
        private: bool | None = None,
        token: str | None = None,
        revision: str | None = None,
        create_pr: bool = False,
    ) -> Any:
        """Upload this config as `ipu_config.json` of the Hub repository `repo_id` (created if needed), with
        `huggingface_hub`, as `PretrainedConfig.push_to_hub` does. Returns the commit's `CommitInfo`."""
        return push_config_to_hub(
            self.to_json_string(),
            repo_id,
            commit_message=commit_message,
            private=private,
            token=token,
            revision=revision,
            create_pr=create_pr,
        )

    def _save_file(self, save_directory: str | os.PathLike) -> Path:
        directory = Path(save_directory)
        if directory.is_file():
            raise IncompatibleIPUConfigError(
                f"save_pretrained: {short_repr(str(directory))} is a file; give a folder to hold {CONFIG_NAME}."
            )
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / CONFIG_NAME
        self.to_json_file(path)
        return path

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> IPUConfig:
        """Build from a dict (as read from `ipu_config.json`); `kwargs` override its values."""
        if not isinstance(config_dict, dict):
            raise IncompatibleIPUConfigError(
                f"an IPU config must be a JSON object of fields, got {type(config_dict).__name__}: "
                f"{short_repr(config_dict, 80)}"
            )
        keys = [*config_dict, *kwargs]
        odd = [k for k in keys if not isinstance(k, str)]
        if odd:  # Python would stop at `cls(**...)` with a bare TypeError
            raise IncompatibleIPUConfigError(f"IPUConfig field names must be strings, got {short_repr(odd[0])}")
        config_dict = upgrade_older_keys(config_dict)
        keys = [*config_dict, *kwargs]

        # before `cls(**...)`: a key "self" would be a TypeError (two values for the argument `self`)
        check_unknown_keys([k for k in keys if k not in known_keys()])
        return cls(**{**config_dict, **kwargs})

    @classmethod
    def from_json_file(cls, json_file: str | os.PathLike, **kwargs: Any) -> IPUConfig:

        data = read_json(json_file)
        check_linked_file_keys(json_file, data)  # a link to another file: its keys are not echoed
        return cls.from_dict(data, **kwargs)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | os.PathLike, return_unused_kwargs: bool = False, **kwargs: Any
    ) -> IPUConfig | tuple[IPUConfig, dict[str, Any]]:
        """Load a config.

        Args:
            name_or_path (`str` or `os.PathLike`):
                A folder holding `ipu_config.json`; a path to a JSON file; a Hub id (downloaded with
                `huggingface_hub` into its cache, or read from the cache offline); or, when the Hub cannot serve
                it, the id of a config bundled with the package (`Graphcore/bert-base-ipu`, ... see
                `bundled_config_ids()`).
            return_unused_kwargs (`bool`, *optional*, defaults to `False`):
                As in `transformers`: also return the `kwargs` that are no field (instead of refusing them).
            kwargs:
                Field values that override those of the file, and `n_ipu` to resolve per-pod values. The loading
                options of `transformers`' `from_pretrained` are taken too: `cache_dir`, `revision` and
                `subfolder` say where to look; `token` (or `use_auth_token`), `force_download`, `local_files_only`
                and `proxies` how to download; `resume_download`, `trust_remote_code` and `transformers`' private
                options are accepted without effect.
        """
        # where to look, and how to download (`config_hub.download_config_file` keeps the options it passes on)
        where = {k: kwargs.pop(k) for k in (*HUB_LOADING_KWARGS, *DOWNLOAD_KWARGS) if k in kwargs}
        unused = {}
        if return_unused_kwargs:
            unused = {k: kwargs.pop(k) for k in list(kwargs) if k not in known_keys()}
        config = cls.from_json_file(locate_config_file(name_or_path, **where), **kwargs)
        return (config, unused) if return_unused_kwargs else config

    def update_from_string(self, update_str: str) -> None:
        """Update fields from `"key=value,key=value"`, e.g. `"gradient_accumulation_steps=32,layers_per_ipu=[1 2 -1]"`.

        Values are parsed as JSON-like literals: integers, floats, `true`/`false`, `null`, lists with spaces
        or commas inside brackets. Fields are those of the current mode's view, or explicit `inference_*`.
        """

        updates = parse_update_string(update_str)
        check = self._all_fields()  # every twin kept as it is (ours too): an update of a training value leaves it
        for key, value in updates.items():
            raw_key = f"inference_{key}" if self.mode == "inference" and key in MODE_MANAGED_FIELDS else key
            check[raw_key] = value
        # Validate on a copy first: a bad update leaves this config untouched.
        candidate = type(self).from_dict(check)
        for name in (*FIELDS, "auto_layers"):
            self.__dict__[name] = candidate.__dict__[name]

    def copy(self) -> IPUConfig:
        return copy.deepcopy(self)

    def __eq__(self, other: object) -> bool:
        """Equal fields (the metadata of the files they came from does not count)."""
        if not isinstance(other, IPUConfig):
            return False
        mine, theirs = self._all_fields(), other._all_fields()  # once each: a dict per field cost 6 ms a comparison
        return all(mine[k] == theirs[k] for k in FIELDS)

    def _all_fields(self) -> dict[str, Any]:
        """`to_dict()` with every field, ours at their default included (`to_dict()` leaves those out)."""
        return {**{name: self.__dict__[name] for name in OWN_FIELD_DEFAULTS}, **self.to_dict()}

    def __repr__(self) -> str:
        return f"{type(self).__name__} ({self.mode}) {self.to_json_string()}"


def _report_parallelize_kwargs(fields: dict[str, Any]) -> None:
    """Each key of `parallelize_kwargs` / `inference_parallelize_kwargs` that is not realised here, said once by name.

    The inference keys in `PARALLELIZE_KWARGS_REALISED` become defaults of `generate_static` (or the sequence buckets,
    or `pipeline()`'s int8 weights: see `config_schema`); those in `PARALLELIZE_KWARGS_BUILT_IN` are what
    `transformers`' generation does anyway. Training has no such knob: every training key is reported (its
    `parallelize()` took them on IPUs).
    """
    for field in ("parallelize_kwargs", "inference_parallelize_kwargs"):
        report_parallelize_kwargs(fields[field], f"IPUConfig: `{field}` key", inference=field.startswith("inference_"))


def report_parallelize_kwargs(knobs: dict[str, Any], where: str, inference: bool = True) -> dict[str, Any]:
    """Say once, by name, each knob of an Optimum Graphcore `parallelize()` call (or `parallelize_kwargs` field) that
    has no effect here; return the knobs that do (`PARALLELIZE_KWARGS_REALISED`, for generation: `inference`).

    Args:
        knobs (`dict[str, Any]`): the keyword arguments, e.g. `{"use_cache": True, "on_device_generation_steps": 16}`.
        where (`str`): how the message names a knob's place, e.g. ``"IPUConfig: `parallelize_kwargs` key"``.
        inference (`bool`, *optional*, defaults to `True`): knobs of generation (those of training are all reported).
    """
    realised = {}
    for key, value in knobs.items():
        if inference and key in PARALLELIZE_KWARGS_REALISED:
            realised[key] = value
            continue
        if inference and key in PARALLELIZE_KWARGS_BUILT_IN:
            continue
        reason = PARALLELIZE_KWARGS_REPORTED.get(key, "no model's `parallelize()` takes it here")
        logger.warning_once(f"{where} {short_repr(key, 60)} has no effect: {reason}.")
    return realised


@functools.cache  # reading a distribution's metadata takes ~6 ms; it does not change in a process
def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
