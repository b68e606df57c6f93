"""`generate()` of a model whose stages run on separate processes: the stock decoding loop on every stage.

`StageGeneration` runs `transformers`' own `generate()` on every process of a replica: each model call of the decoding
loop goes through the stages (`stages.forward.StageForward`), and every process picks the same tokens; each process's
KV cache holds the keys and values of its own layers only. A decoder-only model's batch of several rows decodes in
groups in flight (`stages.groups`): every stage computes for some group at each moment, and only token ids come back
from the last stage. Otherwise (one row, beam search, scores asked for, an encoder-decoder), the batch is one group and
the last stage's logits are broadcast to the others.

Calls in lanes (`runtime.lockstep`: a server's generation calls under `torchrun`) decode beside each other: each
call's groups join the rotation of turns that the lanes share at a turn every stage agreed on (`groups.join_rotation`),
while the other calls' groups decode, so a request that arrives while others decode starts at the next turns instead
of waiting for their end. Each lane has its own process groups, made at the first call in it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutputWithPast, Seq2SeqLMOutput

from ...errors import IncompatibleIPUConfigError
from ..joined_rows import RowsSchedule, run_rows
from ..lockstep import current_lane, others_may_run
from .cut import StageCut, hold_place
from .forward import StageForward
from .groups import (
    JoinedStreamer,
    SendTokens,
    StageRows,
    Turns,
    bind_leader_stops,
    group_rows,
    join_rotation,
    join_sequences,
    only_token_logits,
    run_groups,
    split_call,
    with_criterion,
)
from .hold import StageHold, stage_hold

# generate() arguments that need every row's logits on every stage, or one search over all rows: one group
_ONE_GROUP_ARGS = ("assistant_model", "output_scores", "output_logits", "return_dict_in_generate", "prefill_chunk_size")


class StageGeneration:
    """`generate()` of a model whose stages run on separate processes (see the module docstring).

    Every process of the replica calls the stock model's `generate()` with the same arguments inside `generating()`.
    Each call of the model that the decoding loop makes (prefill, then one per token) runs this process's stage on
    its own KV cache (the cache object `generate()` made here; its layers of other stages hold placeholders that keep
    its lengths, `stages.cut.hold_place`); the hidden states travel to the next stage. A batch decoded as one group
    then gets the last stage's logits on every stage: the loop sees the same logits everywhere and, with the same
    random state (shared from the last stage as generation starts), draws the same tokens: greedy, beam search and
    sampling alike. A batch decoded in groups in flight (`generate`, `stages.groups`) gets only the last stage's
    chosen token ids. A process never holds another stage's weights or cache.

    An encoder-decoder model's `generate()` calls its encoder once, apart from the decoding loop: that call runs
    through the stages holding encoder layers (the encoder module's own forward, cut as the model is), and the
    encoder's output is broadcast to every stage. The decoding loop's calls then run through the stages holding
    decoder layers only, each given the encoder output as `encoder_outputs`; a stage of encoder layers only takes
    the logits.

    Args:
        model (`nn.Module`): the stock model, holding its stage only (`stages.hold.stage_hold(model)`).
        cut (`StageCut`): its layers, embeddings and encoder-decoder split.
        hold (`StageHold`): what this process holds: its stage, the replica's stage group and the layout.
    """

    def __init__(self, model: nn.Module, cut: StageCut, hold: StageHold) -> None:
        counts = [len(r) for r in hold.ranges]
        self.model, self.gate, self.cut, self.sharded = model, hold.gate, cut, hold.sharded
        root = hold.gate if hold.sharded else None  # sharded stages run through their FSDP root, as in evaluation
        self.group = hold.mesh.get_group("pp")
        self._last = dist.get_global_rank(self.group, len(counts) - 1)  # the stage whose logits every stage takes
        self._local = threading.local()  # per decoding thread: within a stage's own forward; its group's step
        self._groups: list[_GroupLink] = []  # made at the first call that decodes in groups
        self._lanes: list[list[_GroupLink]] = []  # each lane's links, made at the first call in it (`_lane_links`)
        self._lane_locks: list[threading.Lock] = []  # a lane's previous call ends here before its next starts
        self._lane_turns = Turns()  # the rotation the calls in lanes share
        self._making = threading.Lock()
        # held by a stage's forward, which swaps other stages' modules of the shared model out meanwhile (a call's
        # groups take turns; a call in a lane may make its links while another lane's group computes)
        self._swapping = threading.Lock()
        self._opened, self._was_running = 0, False  # calls inside `generating()`, and the gate before the first
        self._hold, self._root = hold, root
        split = cut.encoder.num_layers if cut.encoder is not None else 0
        # the cache indices (decoder layers, counted from 0) of the layers after this stage's
        self._unreached = range(max(hold.ranges[hold.stage].stop, split) - split, len(cut.layer_paths) - split)
        self.encoder_stages: StageForward | None = None
        self.stages: StageForward | None  # `None` on a stage of encoder layers only
        if cut.encoder is None:
            self.stages = StageForward(model, cut, counts, hold.stage, self.group, gate=root)
            self._output: type = CausalLMOutputWithPast
        else:
            self.encoder_stages, self.stages = _encoder_decoder_chains(
                model, cut, hold.ranges, hold.stage, self.group, root
            )
            encoder_chain, _ = _chains(hold.ranges, cut.encoder.num_layers)
            self._encoder_last = dist.get_global_rank(self.group, encoder_chain[-1])
            self._output = Seq2SeqLMOutput

    @contextmanager
    def generating(self) -> Iterator[None]:
        """While open, a call of the model runs it as described in the class docstring; `generate()` is called
        inside. The model's `forward` (and an encoder-decoder's encoder's) is wrapped on this instance for the time
        of the call (as accelerate's hooks wrap it): no class or module of `transformers` is changed. Calls in lanes
        open it together: the first wraps, the last unwraps."""
        with self._making:
            if self._opened == 0:
                for module, run in self._wrapped():
                    module.forward = self._wrap(module, run)
                self._was_running = self.gate.running
                self.gate.running = True  # the model runs its stage only: its whole forward is replaced meanwhile
            self._opened += 1
        try:
            if current_lane() is None:  # (calls in lanes draw from each process's own generator)
                self._share_random_state()
            with self._gathered_once():
                yield
        finally:
            with self._making:
                self._opened -= 1
                if self._opened == 0:
                    for module, _ in self._wrapped():
                        del module.forward
                    self.gate.running = self._was_running

    def _wrapped(self) -> list[tuple[nn.Module, Any]]:
        """The modules whose forward `generating()` replaces, with what replaces it."""
        wrapped = [(self.model, self._step)]
        if self.cut.encoder is not None:
            wrapped.append((self.model.get_submodule(self.cut.encoder.path), self._encode))
        return wrapped

    @contextmanager
    def _gathered_once(self) -> Iterator[None]:
        """Stages sharded over replicas (FSDP): each unit's parameters are gathered at its first forward (the prefill,
        at the same point in every replica) and kept until generation ends, so the decoding steps make no collective
        of the replicas, whose prompts may stop after different numbers of tokens. Resharded at the end, and put back
        to resharding after each forward, as `fsdp.shard_stages` made them."""
        units = [m for m in self.gate.modules() if isinstance(m, FSDPModule)] if self.sharded else []
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(True, recurse=False)

    def generate(self, **kwargs: Any) -> Any:
        """`model.generate(**kwargs)` inside `generating()`: a decoder-only model's rows in groups in flight (one per
        stage, `stages.groups`) where the call allows it, else as one group; a call in a lane in groups beside the
        other lanes' calls."""
        lane = current_lane()
        if lane is not None:
            return self._generate_in_lane(lane, kwargs)
        groups = self._group_count(kwargs)
        if groups <= 1:
            # (a LeaderStop, `optimum-ipu serve`'s, agrees over the stage group: the whole replica there, as serving
            # refuses stages split over processes)
            return self.model.generate(**bind_leader_stops(kwargs, self.group))
        return self._decode_in_groups(kwargs, self._group_links(groups), Turns(groups))

    def _generate_in_lane(self, lane: int, kwargs: dict[str, Any]) -> Any:
        """A call in `lane`: its rows in groups (one per stage, at most one per row) that join the lanes' rotation,
        the process's other calls free to do their host work meanwhile."""
        why = self._one_group_reason(kwargs)
        if why is not None:
            raise IncompatibleIPUConfigError(
                f"a generation call beside others decodes in groups, and this one cannot ({why}); run it alone"
            )
        links = self._lane_links(lane)
        links = links[: min(len(links), kwargs["input_ids"].shape[0])]
        with others_may_run(), self._lane_locks[lane]:
            return self._decode_in_groups(kwargs, links, self._lane_turns, joining=True)

    def _decode_in_groups(
        self, kwargs: dict[str, Any], links: list[_GroupLink], turns: Turns, joining: bool = False
    ) -> torch.Tensor:
        """The rows of `kwargs`'s call cut into one group per link, each decoded in its own thread, taking `turns`
        (`joining`: a rotation already running, which the groups join at a turn their stages agree on); their
        sequences joined as one `generate()` returns them."""
        groups = len(links)
        rows = kwargs["input_ids"].shape[0]
        parts = group_rows(rows, groups)
        calls = split_call(kwargs, rows, parts)
        calls = [bind_leader_stops(call, links[g].group, parts[g], rows) for g, call in enumerate(calls)]
        pad_token_id = kwargs.get("pad_token_id", self.model.generation_config.pad_token_id)
        streamer = kwargs.get("streamer")
        if streamer is not None:
            joined = JoinedStreamer(streamer, groups, pad_token_id)
            calls = [{**call, "streamer": joined.for_group(g)} for g, call in enumerate(calls)]
        if joining:
            join_rotation(turns, [link.turn for link in links], links[0].group)
        outputs = run_groups(lambda g: self._decode_group(links[g], calls[g], turns), groups)
        return join_sequences(outputs, pad_token_id)

    def decode_joined(self, seed: int, schedule: RowsSchedule | None = None) -> None:
        """Continuous batching through the stages: rows that join and leave (`runtime.joined_rows`) in one group per
        stage, in flight as `generate()`'s groups are, each decoded in its own thread on its own KV cache and process
        group; `schedule` (process 0's) decides each group's joins and ends before each of its passes, the last stage
        chooses the tokens. Every process of the replica calls it; it returns once the schedule has finished every
        group. A group with no row passes its turns (the rotation keeps the stages in step)."""
        why = self._layout_reason()
        if why is not None:
            raise IncompatibleIPUConfigError(f"rows cannot join a running batch through these stages ({why})")
        groups = len(self._hold.ranges)
        links, turns = self._group_links(groups), Turns(groups)
        if schedule is not None:
            schedule.begin(groups)
        with self.generating():
            run_groups(lambda g: self._decode_joined_group(links[g], turns, seed + g, schedule), groups)

    def _decode_joined_group(self, link: _GroupLink, turns: Turns, seed: int, schedule: RowsSchedule | None) -> None:
        """One group's joined rows (in its own thread): its model calls take turns, its tokens come from the last
        stage; a pass without rows passes its turn."""

        def pass_turn() -> None:
            turns.acquire(link.turn)
            turns.release(link.turn)

        with self._in_group(link, turns) as send:
            run_rows(StageRows(self.model, seed, send), schedule, link.group, index=link.turn, idle=pass_turn)

    @contextmanager
    def _in_group(self, link: _GroupLink, turns: Turns) -> Iterator[SendTokens | None]:
        """Within it, this thread's model calls are `link`'s group's (`_GroupStep`); yields what sends the chosen
        tokens on the last stage (None on the others). On leaving, the group's turn held by a failed step is ended and
        the group leaves the rotation."""
        last = self._hold.stage == len(self._hold.ranges) - 1
        send = SendTokens(link.group, link.last, turns, link.turn) if last else None
        self._local.group = _GroupStep(self, link, turns, link.turn, send, self._vocab_size())
        try:
            yield send
        finally:
            self._local.group = None
            if send is not None and send.holding:  # (it failed within its turn)
                turns.release(link.turn)
            turns.leave(link.turn)

    def _group_count(self, kwargs: dict[str, Any]) -> int:
        """How many groups decode `kwargs`'s rows: one per stage (at most one per row); 1 where one group is needed."""
        if self._one_group_reason(kwargs) is not None:
            return 1
        return min(len(self._hold.ranges), kwargs["input_ids"].shape[0])

    def _one_group_reason(self, kwargs: dict[str, Any]) -> str | None:
        """Why `kwargs`'s rows must decode as one group, or None (the layout's reason first, `_layout_reason`)."""
        ids = kwargs.get("input_ids")
        config = self.model.generation_config
        layout = self._layout_reason()
        if layout is not None:
            return layout
        if ids is None or ids.dim() != 2:
            return "no 2-D input_ids"
        if (kwargs.get("num_beams", config.num_beams) or 1) > 1:
            return "beam search"
        given = [name for name in _ONE_GROUP_ARGS if kwargs.get(name, getattr(config, name, None))]
        return f"{given[0]} is given" if given else None

    def _layout_reason(self) -> str | None:
        """Why no call decodes in groups on these stages, or None: sharded over replicas (their units' gathered
        parameters are shared state of FSDP's hooks, which the groups' threads would enter at once), or an
        encoder-decoder model."""
        if self.sharded:
            return "the stages are sharded over replicas"
        if self.cut.encoder is not None:
            return "an encoder-decoder model"
        return None

    def _group_links(self, groups: int) -> list[_GroupLink]:
        """The first `groups` links of the calls alone (every stage of the replica makes them at the same call)."""
        while len(self._groups) < groups:
            self._groups.append(self._link(len(self._groups)))
        return self._groups[:groups]

    def _lane_links(self, lane: int) -> list[_GroupLink]:
        """`lane`'s links, one per stage (made with those of the lanes before it, in order: every process makes
        the same process groups in the same order, whichever of its calls comes first)."""
        stages = len(self._hold.ranges)
        with self._making:
            while len(self._lanes) <= lane:
                first = len(self._lanes) * stages
                self._lanes.append([self._link(first + g) for g in range(stages)])
                self._lane_locks.append(threading.Lock())
            return self._lanes[lane]

    def _link(self, turn: int) -> _GroupLink:
        """A group's own process group over the replica's stages (made by those processes only) and its forward;
        `turn`: its number in its rotation of turns."""
        ranks = dist.get_process_group_ranks(self.group)
        group = dist.new_group(ranks, use_local_synchronization=True)
        counts = [len(r) for r in self._hold.ranges]
        with self._swapping:  # (it reads the model's layers and embeddings: not while a forward swaps them out)
            stages = StageForward(self.model, self.cut, counts, self._hold.stage, group, gate=self._root)
        return _GroupLink(group, stages, dist.get_global_rank(group, len(counts) - 1), turn)

    def _decode_group(self, link: _GroupLink, kwargs: dict[str, Any], turns: Turns) -> torch.Tensor:
        """One group's `generate()` (in its own thread): its model calls take turns, its tokens come from the last
        stage."""
        with self._in_group(link, turns) as send, torch.no_grad():
            return self.model.generate(**(with_criterion(kwargs, send) if send is not None else kwargs))

    def _vocab_size(self) -> int:
        """The width of the logits (the output embeddings' rows; their shape is known on every stage)."""
        head = self.model.get_output_embeddings()
        weight = getattr(head, "weight", None)
        return int(weight.shape[0]) if weight is not None else int(self.model.config.get_text_config().vocab_size)

    def _wrap(self, module: nn.Module, run: Any) -> Any:
        """`module`'s forward while generating: `run(inputs)`, except within a stage's own run of the stock forward."""
        stock = type(module).forward.__get__(module)  # the class's forward, bound (a wrapper would call itself)

        @functools.wraps(stock)
        def forward(*args: Any, **inputs: Any) -> Any:
            if getattr(self._local, "inside", False):  # the stage's own run of the stock forward (StageModule)
                return stock(*args, **inputs)
            if args:
                raise TypeError("generation across stages calls the model with keyword arguments only")
            return run(inputs)

        return forward

    def _run(self, stages: StageForward | None, inputs: dict[str, Any]) -> Any:
        """This process's part of one call through `stages`: the model's output on the chain's last stage."""
        if stages is None:
            return None
        self._local.inside = True
        try:
            with self._swapping:
                return stages(inputs)
        finally:
            self._local.inside = False

    def _step(self, inputs: dict[str, Any]) -> Any:
        """One model call of the decoding loop: this stage's forward, then the last stage's logits everywhere."""
        step = getattr(self._local, "group", None)
        if step is not None:
            return step.run(inputs)
        output = self._run(self.stages, inputs)
        logits = self._broadcast(output.logits if output is not None else None, self._last, _device(inputs))
        self._follow_tokens(inputs, logits.dtype)
        if output is not None:
            return output
        return self._output(logits=logits, cache=inputs.get("cache"))

    def _follow_tokens(self, inputs: dict[str, Any], dtype: torch.dtype) -> None:
        """Placeholders in this process's KV cache for the decoder layers its stage did not reach (those after it,
        or every one on a stage of encoder layers only), as a pass-through layer holds for those before it:
        `generate()` reads lengths from every layer, reorders them for beam search and may return them."""
        cache = inputs.get("cache")
        ids = inputs.get("input_ids" if self.cut.encoder is None else "decoder_input_ids")
        if cache is None or ids is None:
            return
        tokens = torch.empty(ids.shape, dtype=dtype, device=ids.device)
        for index in self._unreached:
            hold_place(cache, index, tokens)

    def _encode(self, inputs: dict[str, Any]) -> BaseModelOutput:
        """The encoder's call in `generate()`: through the encoder's stages, its output then on every stage."""
        extras = [k for k in ("output_attentions", "output_hidden_states") if inputs.get(k)]
        if extras:
            raise IncompatibleIPUConfigError(
                f"generate(..., {extras[0]}=True) with the encoder's stages on separate processes: each process holds "
                f"only its layers' outputs; generate without {extras[0]}, or in one process"
            )
        tensors = {k: v for k, v in inputs.items() if torch.is_tensor(v)}
        output = self._run(self.encoder_stages, tensors)
        hidden = output.last_hidden_state if output is not None else None
        return BaseModelOutput(last_hidden_state=self._broadcast(hidden, self._encoder_last, _device(tensors)))

    def _broadcast(self, tensor: torch.Tensor | None, src: int, device: torch.device) -> torch.Tensor:
        """`tensor` of process `src` on every stage of the replica (its shape and dtype sent first)."""
        header = [(tuple(tensor.shape), tensor.dtype) if tensor is not None else None]
        dist.broadcast_object_list(header, src=src, group=self.group)
        if tensor is None:
            shape, dtype = header[0]
            tensor = torch.empty(shape, dtype=dtype, device=device)
        else:
            tensor = tensor.contiguous()
        dist.broadcast(tensor, src=src, group=self.group)
        return tensor

    def _share_random_state(self) -> None:
        """Every stage takes the last stage's random state (CPU, and this process's GPU): sampling then draws the
        same tokens on every process, whatever each process consumed before."""
        device = next((p.device for p in self.model.parameters() if not p.is_meta), torch.device("cpu"))
        states = [torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None]
        dist.broadcast_object_list(states, src=self._last, group=self.group)
        torch.set_rng_state(states[0])
        if states[1] is not None:
            torch.cuda.set_rng_state(states[1], device)


def decodes_in_lanes(model: nn.Module) -> bool:
    """Whether `model`'s generation calls may run in lanes, beside each other (`runtime.lockstep`): it holds one stage
    of a decoder-only model whose stages are every process of the job (one replica, not sharded; the turns keep one
    replica's stages in step, not the processes of others)."""
    hold = stage_hold(model)
    if hold is None or hold.sharded or getattr(model.config, "is_encoder_decoder", False):
        return False
    return dist.is_initialized() and hold.mesh.size() == dist.get_world_size()


@dataclasses.dataclass
class _GroupLink:
    """What one group of sequences decodes through: its process group, its stage forward, its last stage's rank."""

    group: Any
    stages: StageForward
    last: int
    turn: int  # its number in its rotation of turns


@dataclasses.dataclass
class _GroupStep:
    """One group's model calls on this process (`StageGeneration._step` in the group's thread)."""

    generation: StageGeneration
    link: _GroupLink
    turns: Turns
    index: int
    send: SendTokens | None  # on the last stage: sends the chosen tokens, then ends the turn
    vocab: int

    def run(self, inputs: dict[str, Any]) -> Any:
        """This stage's forward in the group's turn; on the last stage the logits (the turn ends once the tokens are
        chosen and sent), on the others logits allowing only the tokens the last stage chose."""
        self.turns.acquire(self.index)
        if self.send is not None:
            self.send.holding = True
        try:
            output = self.generation._run(self.link.stages, inputs)
        except BaseException:
            if self.send is not None:
                self.send.holding = False
            self.turns.release(self.index)
            raise
        if self.send is not None:
            return output
        self.turns.release(self.index)
        ids = inputs["input_ids"]
        tokens = torch.empty(ids.shape[0], dtype=torch.long, device=ids.device)
        dist.broadcast(tokens, src=self.link.last, group=self.link.group)
        self.generation._follow_tokens(inputs, torch.float32)
        logits = only_token_logits(tokens, self.vocab, torch.float32)
        return CausalLMOutputWithPast(logits=logits, cache=inputs.get("cache"))


def _device(inputs: dict[str, Any]) -> torch.device:
    return next(v.device for v in inputs.values() if torch.is_tensor(v))


def _chains(ranges: Sequence[range], split: int) -> tuple[list[int], list[int]]:
    """The stages of an encoder-decoder's encoder chain (those holding encoder layers, and stage 0: its embeddings)
    and of its decoder chain (those holding decoder layers, and the last stage: its heads), in order."""
    encoder_chain = [s for s, r in enumerate(ranges) if s == 0 or r.start < split]
    decoder_chain = [s for s, r in enumerate(ranges) if r.stop > split or s == len(ranges) - 1]
    return encoder_chain, decoder_chain


def _encoder_decoder_chains(
    model: nn.Module, cut: StageCut, ranges: Sequence[range], stage: int, group: Any, root: Any = None
) -> tuple[StageForward | None, StageForward | None]:
    """This stage's parts of an encoder-decoder's two generation chains (`None` where it takes no part).

    The encoder chain runs the encoder module's own forward over the stages holding encoder layers (stage 0 always:
    it holds the embeddings); the decoder chain runs the whole model's forward, given the encoder's output, over the
    stages holding decoder layers (and the last stage: the heads), the first of them making the decoder's hidden
    states from its embeddings."""
    split = cut.encoder.num_layers
    encoder = model.get_submodule(cut.encoder.path)
    encoder_chain, decoder_chain = _chains(ranges, split)
    counts = [len(r) for r in ranges]
    encoder_cut = StageCut(
        layer_paths=_paths_within(encoder, [model.get_submodule(p) for p in cut.layer_paths[:split]]),
        stand_in=cut.stand_in,
        strict=cut.strict,
        embeddings=_paths_within(encoder, [model.get_submodule(p) for p in cut.embeddings], missing_ok=True),
        shape_only_embeddings=cut.shape_only_embeddings,
    )
    decoder_cut = dataclasses.replace(cut, encoder=None)  # the encoder's output is an input of every decoder stage
    own = ranges[stage]
    encoder_stages = decoder_stages = None
    if stage in encoder_chain:
        layers = range(own.start, min(own.stop, split))
        encoder_stages = StageForward(
            encoder, encoder_cut, counts, stage, group, gate=root, chain=encoder_chain, layers=layers
        )
    if stage in decoder_chain:
        layers = range(max(own.start, split), own.stop)
        decoder_stages = StageForward(
            model, decoder_cut, counts, stage, group, gate=root, chain=decoder_chain, layers=layers
        )
    return encoder_stages, decoder_stages


def _paths_within(root: nn.Module, modules: Sequence[nn.Module], missing_ok: bool = False) -> list[str]:
    """The dotted paths of `modules` within `root` (a module registered under several names: its first)."""
    paths: dict[int, str] = {}
    for name, module in root.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), name)
    if not missing_ok and any(id(m) not in paths for m in modules):
        raise IncompatibleIPUConfigError(f"{type(root).__name__} does not hold every encoder layer of its plan")
    return [paths[id(m)] for m in modules if id(m) in paths]
