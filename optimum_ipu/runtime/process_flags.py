"""Every process-wide setting the library changes, in one place.

Two `IPUConfig` fields have no other handle than process-wide state:
- `enable_half_partials`: CUDA matmuls may reduce in half precision
  (`torch.backends.cuda.matmul.allow_{fp16,bf16}_reduced_precision_reduction`); set on CUDA devices only, and
  only when it changes the current value, which is logged once.
- `executable_cache_dir`: inductor keeps its compiled graphs in `TORCHINDUCTOR_CACHE_DIR` (an environment
  variable inductor reads, and writes its default into on first use) with its FX graph cache on.

Nothing else in `optimum_ipu` writes to `torch.backends`, inductor's config or the environment. Both are set by
an `Engine` (the engine is what runs the model): the half partials when it is built, the compile cache when it
compiles (`Engine.compile`, `Engine.cache_compiled_graphs`); they stay for the process, as the user's own
`torch.backends` settings would; `half_partials(...)` also serves as a context manager that puts the flags back.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from transformers.utils.logging import get_logger

from ..errors import IncompatibleIPUConfigError
from ..files import checked_writable_folder

logger = get_logger(__name__)


def _matmul_flags() -> tuple[bool, bool]:
    matmul = torch.backends.cuda.matmul
    return matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction


def _set_matmul_flags(fp16: bool, bf16: bool) -> None:
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = fp16
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = bf16


def set_half_partials(device: torch.device, enabled: bool) -> None:
    """`enable_half_partials`: let CUDA matmuls reduce in half precision (faster, slightly less exact)."""
    if device.type != "cuda" or _matmul_flags() == (enabled, enabled):
        return
    logger.warning_once(
        f"enable_half_partials={enabled}: CUDA matmuls of this process reduce in "
        f"{'half' if enabled else 'full'} precision (torch.backends.cuda.matmul)"
    )
    _set_matmul_flags(enabled, enabled)


@contextlib.contextmanager
def half_partials(device: torch.device, enabled: bool) -> Iterator[None]:
    """`set_half_partials` for a block only: the flags are put back after it."""
    before = _matmul_flags()
    set_half_partials(device, enabled)
    try:
        yield
    finally:
        _set_matmul_flags(*before)


CACHE_DIR_FIX = 'give a folder this process can write to, or "" for no cache'


def checked_cache_dir(cache_dir: str) -> str:
    """The config's `executable_cache_dir` as an absolute folder, made if needed and checked writable, when the cache
    is first used: a file, `/dev/null` or a read-only folder is one line naming the field, not an `OSError` from
    inside the compiler or the ONNX exporter."""
    return checked_writable_folder(
        cache_dir, "IPUConfig field `executable_cache_dir`", CACHE_DIR_FIX, IncompatibleIPUConfigError
    )


def configure_compile_cache(cache_dir: str) -> None:
    """`executable_cache_dir`: keep inductor's compiled graphs there, so a second run starts warm.

    Raises:
        IncompatibleIPUConfigError: the folder is a file, a device, or cannot be made or written to (one line).
    """
    if cache_dir:
        # Set even if present: inductor writes its default folder into this variable on first use.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = checked_cache_dir(cache_dir)
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = True  # on by default in recent torch; explicit, since we rely on it
