"""Continuous batching of generation requests (`optimum-ipu serve --continuous-batching`): `transformers`' continuous
batching managers (`model.init_continuous_batching()`), where the model is whole in this process.

A request joins the running batch at the next decoding step and leaves it when done, where the static batching of
`serving/generation.py` makes a request that arrives while a batch decodes wait for the whole batch. Issue 38 asks
to use `transformers`' manager where the model is whole in one process if it measures faster than ours; on this
project's CPU it did, with requests arriving while others decode (`benchmarks/continuous_batching.py`: a random
124 M GPT-2, 24 greedy requests of 8 to 64 tokens arriving every 0.3 s: 1.40-1.42x the tokens/s, p50 latency
0.28-0.31x, the same greedy tokens for every request; sampled requests at temperature 0.8, 1.26-1.28x, p50
0.35-0.36x). The managers' warm-up (about 10 s each here) runs before `/health` says ready.

What it takes: requests of one choice (`n` 1) without a `seed`, greedy or sampled, on a model held whole in this
process. Two managers share the model, each with its KV cache: a greedy one (`do_sample=False`: the argmax, as
`model.generate` chooses) and a sampling one whose requests carry their own settings (its per-request logits
processors): `temperature` and `top_p` with no top-k (OpenAI's sampling, as the static path does; the manager's
`top_k` 0 would keep one token, so "no top-k" is the whole vocabulary). One manager for both, greedy requests keeping
their one most likely token, measured 1.25-1.28x the static batching's tokens/s where the greedy manager gave
1.35-1.38x (`benchmarks/continuous_batching.py --sampling-manager`, three runs each): its processors sort the
vocabulary twice a step. The others (several choices, which a manager fixes for every request at its creation; a
seed, which needs a batch of its own) are batched statically as before.

"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from typing import Any

from ..pipelines.processes import causal_model
from .generation import Choice, GenerationSink, cut_at_stop, eos_token_ids, new_text, prompt_ids

logger = logging.getLogger(__name__)
HANDLER_GRACE_S = 5.0  # seconds a cancelled request's handler stays, for the outputs of the step in flight


class ContinuousGeneration:
    """`transformers`' continuous batching managers over the served pipeline's model (see the module docstring).

    Args:
        pipe: the `text-generation` pipeline the server serves (its model whole in this process).
        max_batch_size (`int`, *optional*, defaults to 8): requests each manager decodes at once.
    """

    def __init__(self, pipe: Any, max_batch_size: int = 8) -> None:
        self.check(pipe)
        self.pipe, self.max_batch_size = pipe, max_batch_size
        self.model = causal_model(pipe)  # (the transformers model inside its PipelinedModel)
        self.eos = eos_token_ids(pipe)
        self.managers: dict[bool, Any] = {}  # by `do_sample`: the greedy manager, the sampling one
        self.in_flight = 0

    @staticmethod
    def check(pipe: Any) -> None:
        """One line when the manager cannot serve this pipeline: another task, or a model across processes."""
        if getattr(pipe, "task", None) != "text-generation":
            raise ValueError(
                f"--continuous-batching: batches generation requests; this server's task is {pipe.task}: leave it out"
            )
        if hasattr(pipe, "lockstep"):
            raise ValueError(
                "--continuous-batching: the model's stages run on the processes of a torchrun job, and transformers' "
                "manager drives a model whole in one process; leave it out under torchrun"
            )

    def start(self) -> None:
        """Make both managers (the model's end-of-sequence tokens), warm them up and start their loops (blocking:
        run it off the event loop)."""
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        eos = sorted(self.eos) or -1  # -1: no end-of-sequence token, every request generates its max_tokens
        pad = self.pipe.tokenizer.pad_token_id
        configs = {
            False: GenerationConfig(do_sample=False, eos_token_id=eos, pad_token_id=pad),
            # a temperature, top-k and top-p processor (each made only for a value other than the neutral one),
            # which every request then sets for itself (`_sampling`)
            True: GenerationConfig(
                do_sample=True, temperature=0.5, top_k=1, top_p=0.5, eos_token_id=eos, pad_token_id=pad
            ),
        }
        for sampling, config in configs.items():
            cache = self.cache_config(ContinuousBatchingConfig, per_request_processors=sampling)
            manager = self.model.init_continuous_batching(generation_config=config, continuous_batching_config=cache)
            manager.warmup()
            manager.start()
            self.managers[sampling] = manager

    def cache_config(self, config_class: type, **options: Any) -> Any:
        """A manager's KV cache sized by the server's limits: `max_batch_size` requests decoding at once, each up to
        the model's positions (the others wait in its queue, without cache). Left to itself, the manager takes 60%
        of the machine's free memory on a CPU (90% of a GPU's): two servers, or a server beside a training job,
        would not fit."""
        from ..pipelines.base import position_limit

        page = 256
        positions = position_limit(self.model.config) or 2048
        blocks = self.max_batch_size * (-(-positions // page) + 1)  # whole pages a request, and one to spare each
        return config_class(
            page_size=page,
            num_blocks=blocks,
            max_batch_tokens=max(page, self.max_batch_size * self.pipe.max_seq_length),
            max_requests_per_batch=self.max_batch_size,
            **options,
        )

    def stop(self) -> None:
        """Stop the managers' loops (the requests in flight have finished once the server drained)."""
        while self.managers:
            _, manager = self.managers.popitem()
            manager.stop(block=True, timeout=30)

    def takes(self, kwargs: dict[str, Any]) -> bool:
        """Whether a request of these pipeline arguments runs here (one choice, no seed) once started."""
        return bool(self.managers) and kwargs.get("num_return_sequences", 1) == 1 and "seed" not in kwargs

    def _sampling(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The sampling manager's per-request settings of a request's pipeline arguments (the module docstring):
        its temperature and top-p, and every token (no top-k)."""
        vocabulary = self.model.get_output_embeddings().weight.shape[0]
        return {"temperature": float(kwargs["temperature"]), "top_p": float(kwargs["top_p"]), "top_k": vocabulary}

    def submit(self, sink: GenerationSink, prompts: list[Any], kwargs: dict[str, Any], param: str) -> asyncio.Future:
        """Add one manager request per prompt; the future of `sink` once every choice has ended (cancelling it
        cancels the requests). Raises the pipeline's `InputError` for a prompt it refuses."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        prompts_ids = [prompt_ids(self.pipe, prompt, param) for prompt in prompts]
        sink.prompt_tokens = sum(len(ids) for ids in prompts_ids)
        sink.choices = [Choice() for _ in prompts_ids]
        stop = list(kwargs.get("stop_sequence", []))
        streaming = sink.queue is not None or bool(stop)  # each token as it comes: to stream, or to find a stop
        sampled = bool(kwargs.get("do_sample"))
        manager, sampling = self.managers[sampled], self._sampling(kwargs) if sampled else {}
        tag = uuid.uuid4().hex
        request_ids = [f"{tag}-{index}" for index in range(len(prompts_ids))]
        pending = set(request_ids)
        for index, (request_id, ids) in enumerate(zip(request_ids, prompts_ids, strict=True)):
            on_result = functools.partial(self._on_result, manager, future, sink, index, ids, stop, pending, request_id)
            manager.register_result_handler(request_id, on_result)
            manager.add_request(
                ids, request_id=request_id, max_new_tokens=kwargs["max_new_tokens"], streaming=streaming, **sampling
            )
        self.in_flight += 1
        future.add_done_callback(functools.partial(self._done, manager, pending))
        return future

    def _on_result(
        self,
        manager: Any,
        future: asyncio.Future,
        sink: GenerationSink,
        index: int,
        ids: list[int],
        stop: list[str],
        pending: set[str],
        request_id: str,
        result: Any,
    ) -> None:
        """A result of one request (in the event loop): its new tokens to the choice (and the stream), its end."""
        if future.done() or request_id not in pending:
            return
        if result.error is not None:
            logger.error("continuous batching: request %s failed: %s", request_id, result.error)
            future.set_exception(RuntimeError(f"continuous batching: {result.error}"))
            return
        choice = sink.choices[index]
        for token in result.generated_tokens[len(choice.ids) :]:
            choice.ids.append(token)
            choice.ended = token in self.eos
            if sink.queue is not None:
                sink.queue.put_nowait((index, token))
        if stop or result.is_finished() or choice.ended:  # (decoded only when needed: each decode reads them all)
            choice.text = new_text(self.pipe.tokenizer, choice.ids)
        stopped = bool(stop) and cut_at_stop(choice.text, stop)[1]
        if not (result.is_finished() or stopped or choice.ended):
            return
        if not result.is_finished():  # a stop string or the end token: the manager stops it at the next step
            self._cancel(manager, request_id)
        pending.discard(request_id)
        if not pending:
            future.set_result(sink)

    def _done(self, manager: Any, pending: set[str], future: asyncio.Future) -> None:
        """The request ended: answered, or cancelled (its manager requests are cancelled, freeing their places)."""
        self.in_flight -= 1
        if future.cancelled():
            for request_id in list(pending):
                self._cancel(manager, request_id)
            pending.clear()

    def _cancel(self, manager: Any, request_id: str) -> None:
        """Cancel a request in the manager (freed at its next step), and forget its result handler a little later:
        a cancelled request gets no last result, which would drop the handler, and outputs of the step in flight
        without a handler would pile up in the manager's shared queue, which nothing here reads."""
        if manager not in self.managers.values():  # (stopped)
            return
        manager.cancel_request(request_id)
        handlers = manager.output_router.result_handlers
        asyncio.get_running_loop().call_later(HANDLER_GRACE_S, handlers.pop, request_id, None)
