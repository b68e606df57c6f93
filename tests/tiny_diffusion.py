"""Tiny random Stable Diffusion folders (`diffusers`' layout) for the tests: no weights can be downloaded here."""

from __future__ import annotations

import json
import string
from pathlib import Path

import diffusers
import torch
import transformers


def _tokenizer(folder) -> transformers.CLIPTokenizer:
    """A CLIP BPE tokenizer over the letters (and a few merges): no CLIP vocabulary can be downloaded here."""
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for letter in string.ascii_lowercase:
        vocab[letter], vocab[f"{letter}</w>"] = len(vocab), len(vocab) + 1
    merges = ["a p", "ap p", "l e</w>", "a n</w>"]
    for merge in merges:
        vocab["".join(merge.split())] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return transformers.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=12)


def save_tiny_stable_diffusion(folder: Path, in_channels: int, sample_size: int, vae_blocks: int = 2) -> None:
    """Random tiny Stable Diffusion components (UNet with `in_channels`: 4, or 9 for inpainting; latents of
    `sample_size`; a VAE of `vae_blocks` blocks, which scales images by 2 ** (vae_blocks - 1)), saved by
    `diffusers`' `save_pretrained`."""
    torch.manual_seed(0)
    Path(folder).mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(Path(folder))
    unet = diffusers.UNet2DConditionModel(
        block_out_channels=(4, 8),
        layers_per_block=1,
        sample_size=sample_size,
        in_channels=in_channels,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=2,
        norm_num_groups=2,
    )
    vae = diffusers.AutoencoderKL(
        block_out_channels=[4, *[8] * (vae_blocks - 1)],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * vae_blocks,
        up_block_types=["UpDecoderBlock2D"] * vae_blocks,
        latent_channels=4,
        norm_num_groups=2,
    )
    text_config = transformers.CLIPTextConfig(
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_hidden_layers=1,
        vocab_size=len(tokenizer.get_vocab()),
        max_position_embeddings=12,
    )
    scheduler = diffusers.DDIMScheduler(
        beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False, steps_offset=1
    )
    diffusers.StableDiffusionPipeline(
        vae=vae,
        text_encoder=transformers.CLIPTextModel(text_config),
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    ).save_pretrained(folder)
