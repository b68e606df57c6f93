"""What travels between pipeline stages on processes is described by one small tensor, not a pickled object: the
count of tensors, then for each its dtype (an index into `DTYPES`), its number of dimensions and its sizes (padded to
`MAX_DIMS`). `send_described` and `receive_described` carry tensors with it: the forward through the stages
(`stages.forward`) and the head they share (`stages.head`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

DTYPES = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.bool,
    torch.uint8,
)
MAX_TENSORS, MAX_DIMS = 4, 6
HEADER_LENGTH = 1 + MAX_TENSORS * (2 + MAX_DIMS)


def encode_shapes(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The header of `tensors`: their count, and each one's dtype, number of dimensions and sizes."""
    if len(tensors) > MAX_TENSORS or any(t.dim() > MAX_DIMS or t.dtype not in DTYPES for t in tensors):
        raise ValueError(f"cannot describe {[(t.dtype, tuple(t.shape)) for t in tensors]} between stages")
    values = [len(tensors)]
    for tensor in tensors:
        values += [DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape, *[0] * (MAX_DIMS - tensor.dim())]
    values += [0] * (HEADER_LENGTH - len(values))
    return torch.tensor(values, dtype=torch.int64, device=device)


def decode_shapes(header: torch.Tensor) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    """The `(dtype, shape)` of each tensor a header describes (`encode_shapes`)."""
    values = header.tolist()
    described = []
    for i in range(values[0]):
        dtype, dims, *sizes = values[1 + i * (2 + MAX_DIMS) : 1 + (i + 1) * (2 + MAX_DIMS)]
        described.append((DTYPES[dtype], tuple(sizes[:dims])))
    return described


def send_described(tensors: Sequence[torch.Tensor], dst: int, group: Any) -> list[Any]:
    """Send `tensors` to global rank `dst` over `group` without waiting: their header, then each (contiguous); the
    sends' works, which hold the tensors until sent."""
    tensors = tuple(t.contiguous() for t in tensors)
    header = encode_shapes(tensors, tensors[0].device)
    return [dist.isend(t, dst=dst, group=group) for t in (header, *tensors)]


def receive_described(src: int, group: Any, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The tensors global rank `src` sent over `group` with `send_described`."""
    header = torch.empty(HEADER_LENGTH, dtype=torch.int64, device=device)
    dist.recv(header, src=src, group=group)
    tensors = tuple(torch.empty(shape, dtype=dtype, device=device) for dtype, shape in decode_shapes(header))
    for tensor in tensors:
        dist.recv(tensor, src=src, group=group)
    return tensors
