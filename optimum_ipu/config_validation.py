"""Checking, parsing and locating `IPUConfig` files. Pure Python: imports no torch.

Every problem is one `IncompatibleIPUConfigError` that names the field, the value given and what is
allowed, so a user fixes the file without reading a traceback.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config_hub import download_config_file
from .config_schema import CONFIG_NAME, DEPRECATED_KEYS, FIELDS, METADATA_KEYS, OUTPUT_MODES
from .errors import MAX_LINE, IncompatibleIPUConfigError, elide, short_repr
from .files import nearest_sibling, not_a_file, path_length_problem, read_json_file

logger = logging.getLogger(__name__)
BUNDLED_DIR = Path(__file__).parent / "ipu_configs"

_POSITIVE_INTS = (
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
    "tensor_parallel_size",
    "inference_tensor_parallel_size",
)
_BOOLS = (
    "optimizer_state_offchip",
    "replicated_tensor_sharding",
    "enable_half_partials",
    "recompute_checkpoint_every_layer",
    "auto_loss_scaling",
    "explicit_ir_inference",
    "execute_encoder_on_cpu_for_generation",
)
# what a count means, where "an integer >= 1" alone does not say which number to give
_COUNT_MEANING = dict.fromkeys(
    ("tensor_parallel_size", "inference_tensor_parallel_size"),
    " (the devices that share each pipeline stage's matrices; 1 for none)",
)
_POD_KEY = re.compile(r"^(pod\d+|default)$")
MAX_SEED = 2**32 - 1
# Upper bounds of counts: far above any pod, low enough that nothing built from them (a list per device slot,
# a loop per micro-batch) can exhaust memory. `{"ipus_per_replica": 1000000000}` built an 8 GB list. The devices that
# share a stage (`tensor_parallel_size`) have the same bound as the stages of a replica.
MAX_IPUS_PER_REPLICA = 1024
MAX_COUNT = 2**20
MAX_LAYERS = 2**16
MAX_CONFIG_BYTES = 1 << 20  # an ipu_config.json is a few hundred bytes
MAX_KWARGS_DEPTH, MAX_KWARGS_ITEMS = 8, 1000


def _fail(field: str, value: Any, allowed: str) -> IncompatibleIPUConfigError:
    return IncompatibleIPUConfigError(f"IPUConfig field `{field}`: got {short_repr(value)}; {allowed}.")


def _count_limit(field: str) -> int:
    return MAX_IPUS_PER_REPLICA if field.endswith(("ipus_per_replica", "tensor_parallel_size")) else MAX_COUNT


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def known_keys() -> list[str]:
    """Every key an `ipu_config.json` may hold (fields, Optimum Graphcore's metadata, deprecated keys) and `n_ipu`."""
    return [*FIELDS, *METADATA_KEYS, *DEPRECATED_KEYS, "n_ipu"]


def check_metadata(metadata: dict[str, Any]) -> None:
    """Optimum Graphcore's metadata keys hold version strings (or null); anything else is a damaged file."""
    for key, value in metadata.items():
        if value is not None and not isinstance(value, str):
            raise _fail(key, value, 'expected a version string such as "1.6.1", or null (metadata, no effect)')


def check_unknown_keys(keys: list[str]) -> None:
    """Raise for keys that are no field of `IPUConfig`, suggesting the closest known one."""
    known = known_keys()
    for key in keys:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}`?" if close else "see docs/ipu-config.md for the keys allowed"
        raise IncompatibleIPUConfigError(f"IPUConfig has no field `{elide(key, 80)}`; {hint}")


def resolve_pod_values(values: dict[str, Any], n_ipu: int | None, pod_type: str | None) -> dict[str, Any]:
    """Replace per-pod dicts such as `{"pod4": 1, "pod16": 4, "default": 1}` by one value.

    The key is `pod{n_ipu}` when `n_ipu` is given and present, else `pod_type` (older files), else `default`.
    """
    if n_ipu is not None and (not _is_int(n_ipu) or n_ipu < 1):
        raise _fail("n_ipu", n_ipu, "expected the number of devices, an integer >= 1")
    if pod_type is not None and not (isinstance(pod_type, str) and _POD_KEY.match(pod_type)):
        # checked before use: an unhashable value (a list) would otherwise fail inside the dict lookup below
        raise _fail("pod_type", pod_type, 'expected null or a pod name such as "pod16"')
    resolved = dict(values)
    for field, value in values.items():
        if not (isinstance(value, dict) and value and all(isinstance(k, str) and _POD_KEY.match(k) for k in value)):
            continue
        for key in (f"pod{n_ipu}" if n_ipu else None, pod_type, "default"):
            if key in value:
                resolved[field] = value[key]
                break
        else:
            wanted = f"pod{n_ipu}" if n_ipu else (pod_type or "default")
            raise _fail(field, value, f"no entry for `{wanted}` and no `default`; add one of them")
    return resolved


AUTO_LAYERS = "auto"


def take_auto_layers(values: dict[str, Any]) -> tuple[str, ...]:
    """The layout fields given as `"auto"` (balanced from measured costs when the model is parallelized, by
    `optimum_ipu.runtime.stages.balance`): each becomes one `-1` wildcard per stage here, the even split until then, so
    the config layer stays torch-free. `"auto"` needs the number of stages: `ipus_per_replica` (or its inference twin).
    An inference layout not given follows an `"auto"` training one."""
    if values.get("layers_per_ipu") == AUTO_LAYERS and values.get("inference_layers_per_ipu") is None:
        values["inference_layers_per_ipu"] = AUTO_LAYERS
    auto = []
    for prefix in ("", "inference_"):
        field, ipus_field = f"{prefix}layers_per_ipu", f"{prefix}ipus_per_replica"
        if values.get(field) != AUTO_LAYERS:
            continue
        ipus = values.get(ipus_field) if values.get(ipus_field) is not None else values.get("ipus_per_replica")
        if not _is_int(ipus) or not 1 <= ipus <= MAX_IPUS_PER_REPLICA:
            raise _fail(field, AUTO_LAYERS, f'"auto" needs `{ipus_field}`, the number of stages; set it (e.g. 4)')
        values[field] = [-1] * ipus
        auto.append(field)
    return tuple(auto)


def check_exclusive_serialization(values: dict[str, Any]) -> None:
    """A serialization factor and per-IPU splits say the same thing twice: accept only one."""
    for prefix in ("", "inference_"):
        for kind in ("embedding", "projection"):
            factor, splits = f"{prefix}{kind}_serialization_factor", f"{prefix}serialized_{kind}_splits_per_ipu"
            if values.get(factor) is not None and values.get(splits) is not None:
                raise IncompatibleIPUConfigError(
                    f"IPUConfig fields `{factor}` ({short_repr(values[factor])}) and `{splits}` "
                    f"({short_repr(values[splits])}) are "
                    f"both given; give only `{splits}` (the factor is then their sum) or only `{factor}`."
                )


def _check_per_ipu_list(field: str, value: Any, ipus: int, ipus_field: str, minimum: int) -> None:
    if not isinstance(value, list) or not value or not all(_is_int(v) for v in value):
        raise _fail(field, value, f"expected a non-empty list of integers, one per IPU ({ipus_field}={ipus})")
    if any(v > MAX_LAYERS for v in value):
        raise _fail(field, value, f"every entry must be <= {MAX_LAYERS}")
    if any(v < minimum for v in value):
        raise _fail(
            field, value, f"every entry must be >= {minimum}" + (" (-1 is the wildcard)" if minimum < 0 else "")
        )
    if len(value) != ipus:
        raise _fail(
            field,
            value,
            f"it has {len(value)} entries but `{ipus_field}` is {ipus}; "
            f"give one entry per IPU or change `{ipus_field}`",
        )


def check_field_types(values: dict[str, Any], allow_none: bool = False) -> None:
    """Check each field on its own: type and range. `allow_none` skips fields not given yet (before defaults)."""

    def given(field: str) -> bool:
        return not (allow_none and values.get(field) is None)

    for field in ("layers_per_ipu", "inference_layers_per_ipu"):  # first: the IPU counts derive from them
        layers = values[field]
        if given(field) and (not isinstance(layers, list) or not layers or not all(_is_int(n) for n in layers)):
            raise _fail(field, layers, "expected a non-empty list of integers, one per IPU (-1 is the wildcard)")
        if given(field) and (len(layers) > MAX_IPUS_PER_REPLICA or max(layers) > MAX_LAYERS):
            raise _fail(field, layers, f"expected at most {MAX_IPUS_PER_REPLICA} entries, each <= {MAX_LAYERS}")
        if given(field) and min(layers) < -1:
            raise _fail(field, layers, "every entry must be >= -1 (-1 is the wildcard)")
    for field in _POSITIVE_INTS:
        if given(field) and (not _is_int(values[field]) or values[field] < 1):
            raise _fail(field, values[field], "expected an integer >= 1" + _COUNT_MEANING.get(field, ""))
        if given(field) and values[field] > _count_limit(field):
            raise _fail(field, values[field], f"expected at most {_count_limit(field)}, far above any pod")
    for field in _BOOLS:
        if not isinstance(values[field], bool):
            raise _fail(field, values[field], "expected true or false")
    if values["output_mode"] not in OUTPUT_MODES:
        raise _fail("output_mode", values["output_mode"], f"expected one of {', '.join(map(repr, OUTPUT_MODES))}")
    if values["seed"] is not None and (not _is_int(values["seed"]) or not 0 <= values["seed"] <= MAX_SEED):
        # the range `transformers.set_seed` accepts (numpy's seeds are 32-bit), so the seed can always be used
        raise _fail("seed", values["seed"], f"expected null or an integer in [0, {MAX_SEED}]")
    if not isinstance(values["executable_cache_dir"], str):
        raise _fail(
            "executable_cache_dir", values["executable_cache_dir"], 'expected a folder path as a string ("" for none)'
        )
    problem = path_length_problem(values["executable_cache_dir"]) if values["executable_cache_dir"] else None
    if problem is not None:  # no filesystem holds it: said now, not when the first graph is cached
        raise _fail(
            "executable_cache_dir", values["executable_cache_dir"], f"{problem}; give a folder path it can hold"
        )
    for prefix in ("", "inference_"):
        field = f"{prefix}matmul_proportion"
        mp = values[field]
        numbers = mp if isinstance(mp, list) else [mp]
        proportions = all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1 for x in numbers)
        if given(field) and (not numbers or not proportions):
            raise _fail(field, mp, "expected a number in (0, 1] or a list of such numbers, one per IPU")
        for kind in ("embedding", "projection"):
            field = f"{prefix}serialized_{kind}_splits_per_ipu"
            splits = values[field]
            if splits is None:
                continue
            if not isinstance(splits, list) or not splits or not all(_is_int(n) and n >= 0 for n in splits):
                raise _fail(field, splits, "expected a list of integers >= 0, one per IPU")
            used = [i for i, n in enumerate(splits) if n > 0]
            if not used:
                raise _fail(field, splits, "at least one IPU must hold a split")
            if used != list(range(used[0], used[-1] + 1)):
                raise _fail(field, splits, "the splits must sit on consecutive IPUs, e.g. [2, 2, 0, 0]")
        field = f"{prefix}parallelize_kwargs"
        if given(field) and not isinstance(values[field], dict):
            raise _fail(field, values[field], "expected a JSON object of keyword arguments")
        if given(field):
            _check_json_value(field, values[field])


def _check_json_value(field: str, value: Any) -> None:
    """A value that is plain JSON, at most `MAX_KWARGS_DEPTH` deep and `MAX_KWARGS_ITEMS` items in all: deeper
    nesting made copying the config a RecursionError."""
    items, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        items += 1
        if depth > MAX_KWARGS_DEPTH or items > MAX_KWARGS_ITEMS:
            raise _fail(field, "...", f"nested deeper than {MAX_KWARGS_DEPTH} or over {MAX_KWARGS_ITEMS} items")
        if isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                raise _fail(field, item, "expected a JSON object (string keys)")
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif not (item is None or isinstance(item, (bool, int, float, str))):
            raise _fail(field, item, "expected JSON values (numbers, strings, booleans, null, lists, objects)")


def validate(v: dict[str, Any]) -> None:
    """Check every field's type and range, then the per-IPU lists against the number of IPUs.

    Args:
        v (`dict[str, Any]`): every field of a config, defaults filled in (`IPUConfig.__dict__`).
    """
    check_field_types(v)
    for prefix in ("", "inference_"):
        ipus_field = f"{prefix}ipus_per_replica"
        ipus = v[ipus_field]
        _check_per_ipu_list(f"{prefix}layers_per_ipu", v[f"{prefix}layers_per_ipu"], ipus, ipus_field, minimum=-1)
        mp_field = f"{prefix}matmul_proportion"
        if isinstance(v[mp_field], list) and len(v[mp_field]) != ipus:
            raise _fail(
                mp_field,
                v[mp_field],
                f"it has {len(v[mp_field])} entries but `{ipus_field}` is {ipus}; give one per IPU",
            )
        for kind in ("embedding", "projection"):
            splits_field = f"{prefix}serialized_{kind}_splits_per_ipu"
            if v[splits_field] is not None:
                _check_per_ipu_list(splits_field, v[splits_field], ipus, ipus_field, minimum=0)


# Sequence-length buckets (`inference_parallelize_kwargs["sequence_buckets"]`, `pipeline(buckets=...)`): one compiled
# graph each. torch.compile(dynamic=False) keeps one graph per input shape, up to dynamo's recompile limit (8 by
# default): the buckets are at most that many, so every bucket keeps its graph.
MAX_BUCKETS = 8


def sorted_lengths(buckets: Any, name: str) -> list[int]:
    """`buckets` sorted without repeats, checked to be a non-empty list of positive numbers of tokens."""
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence) or not buckets:
        raise ValueError(f"{name}: got {buckets!r}; expected a list of sequence lengths, e.g. [64, 128, 256, 384]")
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets):
        raise ValueError(f"{name}: got {list(buckets)!r}; every bucket must be a positive number of tokens")
    return sorted(set(buckets))


def check_sequence_buckets(buckets: Any, name: str = "buckets") -> list[int]:
    """`buckets` (a list of sequence lengths, as `inference_parallelize_kwargs["sequence_buckets"]`) sorted and
    checked: positive numbers of tokens, at most `MAX_BUCKETS` of them. Unlike `runtime.inference.runner.check_buckets`,
    the longest need not be a static length: `runtime.inference.runner.buckets_within` adds the width of each batch.

    Args:
        buckets (`Sequence[int]`): the lengths.
        name (`str`, *optional*, defaults to `"buckets"`): the field named in the error (e.g.
            `"inference_parallelize_kwargs.sequence_buckets"`).
    """
    ordered = sorted_lengths(buckets, name)
    if len(ordered) > MAX_BUCKETS:
        raise ValueError(f"{name}: {len(ordered)} given; at most {MAX_BUCKETS} (one compiled graph each)")
    return ordered


def read_json(path: str | os.PathLike) -> Any:
    """Read an `ipu_config.json`; a file that cannot be read or is not JSON (a FIFO, `/dev/zero`, over
    `MAX_CONFIG_BYTES`, not UTF-8, nested too deeply) is one `IncompatibleIPUConfigError` naming the file and the
    cause (`optimum_ipu.files.read_json_file`)."""
    return read_json_file(path, "an IPU config", MAX_CONFIG_BYTES, IncompatibleIPUConfigError)


def bundled_config_ids() -> list[str]:
    """Ids of the configs shipped with the package, e.g. `Graphcore/bert-base-ipu`."""
    return sorted(f"Graphcore/{p.stem}" for p in BUNDLED_DIR.glob("*.json"))


def locate_config_file(
    name_or_path: str | os.PathLike,
    cache_dir: Any = None,
    revision: Any = None,
    subfolder: Any = None,
    **download_options: Any,
) -> Path:
    """Find `ipu_config.json` for a folder, a file, a Hub id (downloaded into the Hugging Face cache, or read from
    it offline) or a bundled `Graphcore/*` id (when the Hub cannot serve it), in that order.

    `cache_dir`, `revision` and `subfolder` say where to look, and `download_options` (`token`, `use_auth_token`,
    `force_download`, `local_files_only`, `proxies`) how to download, as `transformers`' `from_pretrained` takes them.
    """
    for option, value in (("cache_dir", cache_dir), ("revision", revision), ("subfolder", subfolder)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise _fail(option, value, "expected a string (a loading option of from_pretrained)")
    if subfolder:
        check_subfolder(os.fspath(subfolder))
    filename = f"{subfolder}/{CONFIG_NAME}" if subfolder else CONFIG_NAME

    if not isinstance(name_or_path, (str, os.PathLike)):
        raise IncompatibleIPUConfigError(
            f"an IPU config is named by a folder, a JSON file or an id (a string); got {type(name_or_path).__name__} "
            f"{short_repr(name_or_path)}"
        )
    path = Path(name_or_path)
    if _is(path, Path.is_dir):
        if (path / filename).is_file():
            return path / filename
        kind = not_a_file(path / filename)
        if kind is not None:  # a FIFO, a folder, a dangling link: there, but no file to read
            raise IncompatibleIPUConfigError(
                f"{os.fspath(path / filename)!r} is {kind}, not a file; an IPU config is a JSON text file: replace "
                "it with one (IPUConfig().save_pretrained(dir))"
            )
        raise IncompatibleIPUConfigError(
            f"the folder {os.fspath(path)!r} has no {filename}; write one there (IPUConfig().save_pretrained(dir)) "
            "or pass the path of a JSON file"
        )
    if _is(path, Path.is_file):
        return path
    if _is(path, Path.exists):  # a FIFO, a device: refused by read_json with the reason, not searched for as an id
        return path
    name = os.fspath(name_or_path)
    if _looks_like_a_path(name):  # never a Hub id: no download tried
        raise _config_not_found(name, "no such file or folder")
    found, why_not = download_config_file(name, filename, revision=revision, cache_dir=cache_dir, **download_options)
    if found:
        return Path(found)
    bundled = BUNDLED_DIR / f"{name.split('/')[-1]}.json"
    if name.startswith("Graphcore/") and not subfolder and _is(bundled, Path.is_file):
        logger.info("%s: %s; using the copy bundled with optimum-ipu", name, why_not)
        return bundled
    if name.lower().endswith(".json"):
        raise _config_not_found(name, "no such file")
    offline = why_not is not None and "cannot be reached" in why_not
    reason = "not in the local cache, Hub unreachable" if offline else f"the Hub has no {filename} for it"
    raise _config_not_found(name, reason, offline=offline)


def check_subfolder(subfolder: str) -> None:
    """A `subfolder` must stay inside the folder or repository: relative, without a `..` part (else one
    `IncompatibleIPUConfigError` line; `huggingface_hub` raises its own for a Hub id, and a local folder would be
    left)."""
    parts = subfolder.replace("\\", "/").split("/")
    if os.path.isabs(subfolder) or subfolder.startswith(("/", "\\")) or ".." in parts:
        raise IncompatibleIPUConfigError(
            f"subfolder {short_repr(subfolder)}: expected a folder inside the model folder or repository (relative, "
            "no '..'), e.g. subfolder='ipu'"
        )


def check_linked_file_keys(path: str | os.PathLike, data: Any) -> None:
    """A config file reached through a symbolic link whose target holds keys that are no IPU config field is
    refused without naming them: the target is another file than the one named (a link to a secret must not have
    its keys echoed)."""
    name = os.fspath(path)
    if not isinstance(data, dict) or os.path.realpath(name) == os.path.abspath(name):
        return
    known = set(known_keys())
    unknown = [key for key in data if key not in known]
    if unknown:
        raise IncompatibleIPUConfigError(
            f"{name} is a link to {os.path.realpath(name)!r}, which holds {len(unknown)} key(s) that are no IPU "
            "config field (not shown: it is not the file named); point the link at an ipu_config.json"
        )


def _is(path: Path, test: Any) -> bool:
    """`test(path)`, False for a name the file system refuses (longer than a file name may be)."""
    try:
        return test(path)
    except OSError:
        return False


def _looks_like_a_path(name: str) -> bool:
    """A name that cannot be a Hub id (`org/name`): a relative or absolute path, or more than one folder deep."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def _did_you_mean(name: str) -> str | None:
    """The nearest of what `name` may have meant: a file beside it for a path, a bundled id otherwise."""
    if _looks_like_a_path(name) or name.lower().endswith(".json"):
        sibling = nearest_sibling(name, cutoff=0.6)
        return f"{sibling!r} beside it" if sibling else None
    ids = {i.lower(): i for i in bundled_config_ids()}
    key = name.lower() if "/" in name else f"graphcore/{name.lower()}"  # a bare name: the bundled id's end
    close = difflib.get_close_matches(key, ids, n=1, cutoff=0.8)  # 0.8: a typo, not any id ending in "-ipu"
    return repr(ids[close[0]]) if close else None


def _config_not_found(name: str, reason: str, offline: bool = False) -> IncompatibleIPUConfigError:
    """One line that fits `MAX_LINE` characters with the prefix the CLI or a script puts before it: the name (its
    middle cut if long), why, and the fix, kept whole: a did-you-mean, else what to give instead."""
    close = _did_you_mean(name)
    if close is not None:
        fix = f"did you mean {close}?"
    elif offline:
        fix = "check the id, or fetch it online: hf download ID ipu_config.json"
    else:
        fix = "give a folder, a JSON file or a bundled id such as 'Graphcore/bert-base-ipu'"
    rest = f": {reason}; {fix}"
    prefix = "no IPU config found for "
    shown = elide(repr(name), max(20, MAX_LINE - 25 - len(prefix) - len(rest)))  # 25: "run_glue.py: error: "
    return IncompatibleIPUConfigError(f"{prefix}{shown}{rest}")


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in (p.strip() for p in parts) if p]


def _nesting(text: str) -> int:
    """How deep the brackets of a JSON-like literal nest (those inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (not escaped and ch == "\\"), in_string and (escaped or ch != '"')
            continue
        in_string = ch == '"'
        depth += ch in "[{"
        depth -= ch in "]}"
        deepest = max(deepest, depth)
    return deepest


def _parse_value(text: str, key: str = "value") -> Any:
    text = text.strip()
    depth = _nesting(text) if text[:1] in ("[", "{") else 0
    if depth > MAX_KWARGS_DEPTH:  # json.loads would recurse once per level: a RecursionError traceback
        raise IncompatibleIPUConfigError(
            f"IPUConfig update `{key}`: {short_repr(text, 60)} nests {depth} levels deep, over "
            f"{MAX_KWARGS_DEPTH}; no field takes more: give a flat list, e.g. {key}=[1 2 -1]"
        )
    if text.startswith("["):
        text = re.sub(r"(?<=[\d\]])\s+(?=[-\d\[])", ",", text)  # "[1 2 -1]" -> "[1,2,-1]"
    literal = {"True": "true", "False": "false", "None": "null"}.get(text, text)
    try:
        return json.loads(literal)
    except json.JSONDecodeError:
        return text  # a bare string, e.g. output_mode=all or a folder path
    except ValueError:  # Python's limit on integer digits: json.loads' own words name no field
        digits = max(len(run) for run in re.findall(r"\d+", text))
        raise IncompatibleIPUConfigError(
            f"IPUConfig update `{key}`: a {digits}-digit number, over the {sys.get_int_max_str_digits()} digits Python "
            "reads as an integer; no field takes such a value: give a smaller one"
        ) from None


def parse_update_string(update_str: str) -> dict[str, Any]:
    """Parse `"k=v,k=[1 2 -1]"` into a dict of known fields."""

    if not isinstance(update_str, str):
        raise IncompatibleIPUConfigError(
            f"IPUConfig update: expected a string of key=value pairs, got {type(update_str).__name__} "
            f"{short_repr(update_str)}"
        )
    updates: dict[str, Any] = {}
    for item in _split_top_level(update_str):
        if "=" not in item:
            raise IncompatibleIPUConfigError(
                f"IPUConfig update {short_repr(item)} has no '='; write key=value pairs separated by commas, "
                'e.g. "gradient_accumulation_steps=32,layers_per_ipu=[1 2 -1]"'
            )
        key, value = (s.strip() for s in item.split("=", 1))
        if not key:
            raise IncompatibleIPUConfigError(
                f"IPUConfig update {short_repr(item)} has no field name before '='; write key=value, e.g. seed=42"
            )
        if key not in FIELDS:
            check_unknown_keys([key] if key not in known_keys() else [])
            # a known key that is no stored field: accepting it silently would ignore what the user asked for
            raise IncompatibleIPUConfigError(
                f"IPUConfig update {short_repr(item)}: `{key}` is not a field that can be updated "
                + (
                    "(the pod size is given apart: `n_ipu=` of from_pretrained, or --n_ipu)"
                    if key == "n_ipu"
                    else "(metadata of the file, kept as read)"
                    if key in METADATA_KEYS
                    else "(a deprecated key without effect); leave it out"
                )
            )
        updates[key] = _parse_value(value, key)
    return updates
