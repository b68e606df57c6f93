"""`embedding_serialization_factor` and `projection_serialization_factor` on unmodified `transformers` models.

On an IPU these factors split the vocabulary embedding and the output projection into chunks so that no single
operation needs the whole vocabulary-sized tensor in tile memory. Here the same arithmetic is reproduced by swapping
ONE submodule instance in its parent (no class patching), reusing the very same `nn.Parameter` objects so that
state_dict keys, optimizer state and weight tying are untouched, and swapping the original back afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint
from transformers.utils.logging import get_logger

logger = get_logger(__name__)  # transformers' logger: warning_once, once a message per process


def _chunk_size(total: int, factor: int) -> int:
    # Ceil division: `factor` contiguous chunks, the last one possibly shorter (vocab need not divide evenly).
    return -(-total // max(1, min(factor, total)))


class SerializedEmbedding(nn.Module):
    """An `nn.Embedding` whose lookup is computed over `factor` contiguous chunks of the vocabulary.

    Each chunk looks up only the ids that fall in its vocabulary range (others are masked to zero) and the chunk
    results are summed, which gives exactly the output and weight gradient of `nn.Embedding`.

    Args:
        embedding (`nn.Embedding`): the module to serialize; its `weight` Parameter object is reused (not copied),
            so the state_dict key `...weight` and any weight tying are preserved.
        factor (`int`): the number of vocabulary chunks (`embedding_serialization_factor`).
    """

    def __init__(self, embedding: nn.Embedding, factor: int) -> None:
        super().__init__()
        if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
            raise ValueError("SerializedEmbedding supports neither max_norm, scale_grad_by_freq nor sparse")
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        self.weight = embedding.weight  # the same Parameter object, registered under the same name
        self.num_embeddings = embedding.num_embeddings
        self.embedding_dim = embedding.embedding_dim
        self.padding_idx = embedding.padding_idx  # nn.Embedding already made it non-negative
        self.factor = factor

    def forward(self, input_ids: Tensor) -> Tensor:
        size = _chunk_size(self.num_embeddings, self.factor)
        # `split` (not slicing) so backward is a single concatenation of the chunk gradients, not `factor`
        # full-size zero-padded gradients.
        out: Tensor | None = None
        for index, chunk in enumerate(self.weight.split(size, dim=0)):
            start = index * size
            in_chunk = (input_ids >= start) & (input_ids < start + chunk.shape[0])
            local = torch.where(in_chunk, input_ids - start, 0)
            padding = self.padding_idx - start if self.padding_idx is not None else None
            padding = padding if padding is not None and 0 <= padding < chunk.shape[0] else None
            part = torch.where(in_chunk.unsqueeze(-1), F.embedding(local, chunk, padding_idx=padding), 0.0)
            out = part if out is None else out + part
        return out

    def to_embedding(self) -> nn.Embedding:
        """Returns a plain `nn.Embedding` sharing this module's `weight` Parameter."""
        # Built on "meta" so no weight is allocated or initialised before the shared Parameter replaces it.
        embedding = nn.Embedding(self.num_embeddings, self.embedding_dim, padding_idx=self.padding_idx, device="meta")
        embedding.weight = self.weight
        return embedding

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, padding_idx={self.padding_idx}, factor={self.factor}"


class SerializedLinear(nn.Module):
    """An `nn.Linear` (the output projection onto the vocabulary) computed over `factor` chunks of output features.

    Args:
        linear (`nn.Linear`): the module to serialize; its `weight` and `bias` Parameter objects are reused.
        factor (`int`): the number of output-feature chunks (`projection_serialization_factor`).
    """

    def __init__(self, linear: nn.Linear, factor: int) -> None:
        super().__init__()
        if factor < 1:
            raise ValueError(f"factor must be >= 1, got {factor}")
        self.weight = linear.weight
        self.bias = linear.bias  # None registers as an absent parameter, like nn.Linear(bias=False)
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.factor = factor
        self.captured: Tensor | None = None
        self._capture = False

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Within this context, `forward` keeps its input in `captured` and returns an empty `(..., 0)` tensor
        instead of the logits, so that the caller can compute the projection and its loss in chunks
        (`chunked_cross_entropy`) without the full logits ever being built."""
        self._capture, self.captured = True, None
        try:
            yield
        finally:
            self._capture = False

    def forward(self, hidden: Tensor) -> Tensor:
        if self._capture:
            self.captured = hidden
            return hidden.new_empty(*hidden.shape[:-1], 0)
        size = _chunk_size(self.out_features, self.factor)
        weights = self.weight.split(size, dim=0)
        biases = self.bias.split(size) if self.bias is not None else [None] * len(weights)
        return torch.cat([F.linear(hidden, w, b) for w, b in zip(weights, biases, strict=True)], dim=-1)

    def to_linear(self) -> nn.Linear:
        """Returns a plain `nn.Linear` sharing this module's `weight` and `bias` Parameters."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = self.weight
        linear.bias = self.bias
        return linear

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, factor={self.factor}"


class WeightMajorLinear(nn.Module):
    """An `nn.Linear` (the output projection onto a vocabulary) computed as `weight @ hidden.T` for decoding.

    The same products, in the other order: for the few rows of a decoding step against a large vocabulary, CPU BLAS
    runs this shape faster than `nn.Linear`'s `hidden @ weight.T` (measured on an idle 2-core AVX2 EPYC, three runs:
    Whisper tiny.en's 51,864 x 384 head at 5 rows, one per beam, 6.4-8.3 ms against 16.6-17.1 ms; GPT-2's 50,257 x
    768 at 4 rows 10.6-14.4 ms against 29.9-31.0 ms; a 32,000 x 2,048 head at 8 rows 34.0-40.0 ms against 76.6-163.8
    ms). One row runs as `nn.Linear`. The logits equal `nn.Linear`'s up to float rounding (the sums are blocked
    differently).

    Args:
        linear (`nn.Linear`): the projection; its `weight` and `bias` Parameter objects are reused.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._forward_hooks.update(linear._forward_hooks)  # a share's logits gathered over processes, for one

    def forward(self, hidden: Tensor) -> Tensor:
        rows = hidden.reshape(-1, self.in_features)
        if rows.shape[0] < 2:  # one row: both orders are one matrix-vector product (nn.Linear's is no slower)
            return F.linear(hidden, self.weight, self.bias)
        logits = torch.mm(self.weight, rows.T).T.contiguous()
        if self.bias is not None:
            logits = logits + self.bias
        return logits.reshape(*hidden.shape[:-1], self.out_features)


@contextlib.contextmanager
def weight_major_projection(model: nn.Module) -> Iterator[None]:
    """Within this context, the model's output projection (`get_output_embeddings()`, a plain `nn.Linear` on the
    CPU) runs as `WeightMajorLinear`; the original module is back on exit. Other projections are left alone.

    Args:
        model (`nn.Module`): a `PreTrainedModel` about to decode (e.g. inside `generate()`), whole or holding one
            pipeline stage: the stage holding the projection swaps it (through 2 stages, 4-row groups of a 124 M
            GPT-2 decode 0.99-1.11x one process with it, 0.81-0.88x without), the others hold it on the meta device
            and are left alone, as is a projection split over processes (tensor parallelism: its hooks are on the
            module).
    """
    getter = getattr(model, "get_output_embeddings", None)
    try:
        module = getter() if callable(getter) else None
    except NotImplementedError:  # models without token embeddings
        module = None
    split = isinstance(getattr(module, "weight", None), DTensor)
    if type(module) is not nn.Linear or module.weight.device.type != "cpu" or split:
        yield
        return
    places = replace_module_everywhere(model, module, WeightMajorLinear(module))
    try:
        yield
    finally:
        for parent, name in places:
            setattr(parent, name, module)


def _projection_loss_sum(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, ignore_index: int):
    # fp32 logits, as transformers' own loss functions upcast before cross-entropy.
    logits = F.linear(hidden, weight, bias).float()
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")


def chunked_cross_entropy(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, chunks: int, ignore_index: int = -100
) -> Tensor:
    """Mean cross-entropy of `hidden @ weight.T + bias` against `labels`, computed over `chunks` chunks of tokens.

    Each chunk's projection and loss run under `torch.utils.checkpoint`, so only one chunk's `[tokens, vocab]`
    logits (and softmax) exist at a time, in forward and in backward. Per-chunk losses are summed and divided by
    the number of non-ignored tokens of the WHOLE batch (a mean of per-chunk means would weight chunks wrongly).

    Args:
        hidden (`Tensor` of shape `(..., hidden_size)`): the hidden states fed to the projection.
        weight (`Tensor` of shape `(vocab_size, hidden_size)`): the projection weight.
        bias (`Tensor` of shape `(vocab_size,)`, *optional*): the projection bias.
        labels (`Tensor` of shape `(...)`): target ids, `ignore_index` where no loss is wanted.
        chunks (`int`): the number of token chunks; `1` computes everything at once without checkpointing.
        ignore_index (`int`, *optional*, defaults to `-100`): the label value that contributes no loss.

    Returns:
        `Tensor`: the scalar fp32 loss; NaN when every label is ignored, as `F.cross_entropy(reduction="mean")`.
    """
    hidden = hidden.reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1).to(hidden.device)
    if labels.shape[0] != hidden.shape[0]:
        raise ValueError(f"{hidden.shape[0]} hidden states but {labels.shape[0]} labels")
    if chunks <= 1:
        total = _projection_loss_sum(hidden, weight, bias, labels, ignore_index)
    else:
        total = None
        for h, lab in zip(hidden.tensor_split(chunks), labels.tensor_split(chunks), strict=True):
            if h.shape[0] == 0:  # more chunks than tokens
                continue
            part = checkpoint(_projection_loss_sum, h, weight, bias, lab, ignore_index, use_reentrant=False)
            total = part if total is None else total + part
    # 0 / 0 = NaN when everything is ignored, matching F.cross_entropy's mean.
    return total / (labels != ignore_index).sum().to(total.dtype)


def replace_module_everywhere(model: nn.Module, old: nn.Module, new: nn.Module) -> list[tuple[nn.Module, str]]:
    """Put `new` in every place of `model` that holds `old`, and return those `(parent, attribute)` places (to put
    `old` back): a module may be registered in several places (a shared encoder/decoder embedding), and all of them
    must see the swap or the model would use both."""
    places: list[tuple[nn.Module, str]] = []
    seen: set[tuple[int, str]] = set()
    for _, parent in model.named_modules(remove_duplicate=False):
        for name, child in parent._modules.items():
            if child is old and (id(parent), name) not in seen:
                seen.add((id(parent), name))
                places.append((parent, name))
    for parent, name in places:
        setattr(parent, name, new)
    return places


def swap_serialized(model: nn.Module, embedding_factor: int, projection_factor: int) -> Callable[[], None]:
    """Swaps the input embedding and the output projection of a `transformers` model for serialized versions.

    The modules are found with `model.get_input_embeddings()` and `model.get_output_embeddings()`. A factor of 1
    (or less) leaves its module alone, as does a module that is missing or not a plain `nn.Embedding` /
    `nn.Linear` (logged once). State_dict keys and values are unchanged and tied weights stay tied, since the
    swapped modules hold the same Parameter objects under the same names. Restore before calling methods that
    rebuild these modules (e.g. `resize_token_embeddings`).

    Args:
        model (`nn.Module`): a `PreTrainedModel` (or anything with the two accessors).
        embedding_factor (`int`): `embedding_serialization_factor`.
        projection_factor (`int`): `projection_serialization_factor`.

    Returns:
        `Callable[[], None]`: puts the original module objects back (idempotent).
    """
    swapped: list[tuple[list[tuple[nn.Module, str]], nn.Module]] = []
    targets = (
        ("get_input_embeddings", embedding_factor, nn.Embedding, SerializedEmbedding),
        ("get_output_embeddings", projection_factor, nn.Linear, SerializedLinear),
    )
    for accessor, factor, plain, serialized in targets:
        if factor <= 1:
            continue
        getter = getattr(model, accessor, None)
        try:
            module = getter() if callable(getter) else None
        except NotImplementedError:  # transformers' accessors raise for models without token embeddings
            module = None
        # Exact type: a subclass may change forward in ways the chunked version would silently drop.
        if type(module) is not plain:
            logger.warning_once(
                f"{type(model).__name__}.{accessor}() gave {type(module).__name__}, not {plain.__name__}: left as is"
            )
            continue
        try:
            replacement = serialized(module, factor)
        except ValueError as err:
            logger.warning_once(f"{type(model).__name__}.{accessor}(): {err}; left as is")
            continue
        places = replace_module_everywhere(model, module, replacement)
        if not places:
            logger.warning_once(f"{type(model).__name__}.{accessor}() returned a module not registered in the model")
            continue
        swapped.append((places, module))

    def restore() -> None:
        for places, original in swapped:
            for parent, name in places:
                setattr(parent, name, original)

    return restore


def saved_activation_bytes(fn: Callable[[], Tensor]) -> int:
    """Bytes of the tensors autograd saves for backward while `fn()` runs: a deterministic activation-memory proxy.

    Each storage is counted once, at its full size; Parameters (and views of them) are skipped since they are not
    activations. A region under non-reentrant `torch.utils.checkpoint` counts only the inputs the checkpoint saves
    (its internals go through the checkpoint's own hooks), so the one-chunk recomputation peak during backward is
    not included.

    Args:
        fn (`Callable[[], Tensor]`): builds the autograd graph (e.g. a forward pass returning a loss).

    Returns:
        `int`: the total bytes of saved, distinct, non-parameter storages.
    """
    kept: list[Tensor] = []  # hold them so a freed storage's address cannot be reused and miscounted

    def pack(tensor: Tensor) -> Tensor:
        kept.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    storages: dict[tuple[str, int], int] = {}
    for tensor in kept:
        base = tensor._base if tensor._base is not None else tensor
        if isinstance(base, nn.Parameter):
            continue
        storage = tensor.untyped_storage()
        storages[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())
