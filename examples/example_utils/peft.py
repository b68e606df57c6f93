"""Parameter-efficient fine-tuning in the example scripts: LoRA adapters from `peft`, with the flags of TRL's scripts
(`--use_peft`, `--lora_r`, `--lora_alpha`, `--lora_dropout`, `--lora_target_modules`).

The model is wrapped by `peft.get_peft_model` as it is with `transformers.Trainer`; `IPUTrainer` pipelines the stock
model inside the wrapper, trains only the adapters (and a classifier's head, which `peft` keeps trainable for a
sequence-classification task), and saves `adapter_model.safetensors` with `adapter_config.json`, as `peft` writes
them. `peft` is the optional extra `pip install "optimum-ipu[peft]"`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("example_utils")

PEFT_MISSING = 'peft is not installed; --use_peft needs it: pip install "optimum-ipu[peft]"'


@dataclass
class PeftArguments:
    """LoRA adapters (TRL's flags): with `--use_peft`, only rank-`lora_r` updates of the targeted layers train."""

    use_peft: bool = field(default=False, metadata={"help": "Train LoRA adapters (peft) instead of every weight."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha: the update is scaled by alpha / r."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA path."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "Names of the modules that get adapters (e.g. q_proj v_proj, or all-linear); by default the "
            "attention projections peft knows for the model's family."
        },
    )

    def __post_init__(self) -> None:
        if not self.use_peft:
            return
        # an adapter that can never move (alpha 0: the update scaled by 0; dropout 1: every input to it dropped)
        # would train nothing and end with exit 0
        if isinstance(self.lora_r, bool) or not isinstance(self.lora_r, int) or self.lora_r < 1:
            raise ValueError(f"--lora_r: got {self.lora_r!r}; expected a rank >= 1 (e.g. 8 or 16)")
        if not self.lora_alpha > 0:
            raise ValueError(f"--lora_alpha: got {self.lora_alpha!r}; expected > 0 (alpha 0 scales every update to 0)")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(
                f"--lora_dropout: got {self.lora_dropout!r}; expected a probability in [0, 1) (1 drops every input "
                "of the adapters, so nothing trains)"
            )


def _check_rank(model: Any, rank: int) -> None:
    """A rank above every linear layer's smaller side adds nothing a full update lacks, and `--lora_r 100000000`
    would allocate gigabytes before failing: refused before the adapters are made."""
    from torch import nn

    sides = [min(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]
    if sides and rank > max(sides):
        raise ValueError(
            f"--lora_r: got {rank}; the model's linear layers have rank {max(sides)} at most: pass --lora_r <= "
            f"{max(sides)} (8 or 16 is usual)"
        )


def import_peft() -> Any:
    """`peft`, or an `ImportError` naming the extra that installs it."""
    try:
        import peft
    except ImportError as err:
        raise ImportError(PEFT_MISSING) from err
    return peft


def maybe_wrap_with_lora(model: Any, args: PeftArguments, task_type: str | None = None) -> Any:
    """
    `model` with LoRA adapters when `--use_peft` (`peft.get_peft_model`), else `model` as it is.

    Args:
        model (`transformers.PreTrainedModel`): The stock model.
        args (`PeftArguments`): The script's LoRA flags.
        task_type (`str`, *optional*): `peft`'s task type (`"CAUSAL_LM"`, `"SEQ_CLS"`, `"QUESTION_ANS"`, ...), which
            keeps a new classifier head trainable and saved; `None` for a model without one (masked LM).

    Raises:
        `ImportError`: `--use_peft` without `peft` installed, naming the extra.
    """
    if not args.use_peft:
        return model
    peft = import_peft()
    _check_rank(model, args.lora_r)
    targets: list[str] | str | None = args.lora_target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"  # peft's spelling for every linear layer but the output head
    config = peft.LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=targets,
        task_type=task_type,
    )
    model = peft.get_peft_model(model, config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info("LoRA adapters (r=%d): %d of %d parameters train", args.lora_r, trainable, total)
    return model
