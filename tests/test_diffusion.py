"""Stable Diffusion through `diffusers` (optimum_ipu.diffusers, pipeline("text-to-image")): the images of
`diffusers`' own pipelines on the same tiny random components and seed, Optimum Graphcore's `from_pretrained`
keywords and IPU configs, the lines said once at load, placement on two devices, and the missing-extra error."""

from __future__ import annotations

import logging
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

from optimum_ipu import IPUConfig  # noqa: E402
from optimum_ipu.diffusers import (  # noqa: E402
    IPUStableDiffusionImg2ImgPipeline,
    IPUStableDiffusionInpaintPipeline,
    IPUStableDiffusionPipeline,
    get_default_ipu_configs,
)
from optimum_ipu.pipelines import diffusion, pipeline  # noqa: E402
from optimum_ipu.runtime.devices import DeviceInfo  # noqa: E402

from .tiny_diffusion import save_tiny_stable_diffusion  # noqa: E402

LOGGER = "optimum_ipu.pipelines.diffusion"
SIZE = 16  # pixels; the tiny VAE halves it once (latents of 8 x 8)
PROMPT = "an apple"


@pytest.fixture(scope="module")
def sd_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-sd")
    save_tiny_stable_diffusion(folder, in_channels=4, sample_size=SIZE // 2)
    return str(folder)


@pytest.fixture(scope="module")
def inpaint_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-sd-inpaint")
    save_tiny_stable_diffusion(folder, in_channels=9, sample_size=SIZE // 2)
    return str(folder)


def _images(pipe, seed: int = 0, **kwargs) -> np.ndarray:
    kwargs = {"num_inference_steps": 2, "guidance_scale": 7.5, "output_type": "np", **kwargs}
    return pipe(PROMPT, generator=torch.Generator().manual_seed(seed), **kwargs).images


def _picture(seed: int):
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(SIZE, SIZE, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def test_text_to_image_is_diffusers_with_optimum_graphcores_keywords(sd_folder, tmp_path):
    ours = IPUStableDiffusionPipeline.from_pretrained(
        sd_folder,
        n_ipu=4,
        num_prompts=1,
        num_images_per_prompt=1,
        common_ipu_config_kwargs={"executable_cache_dir": str(tmp_path / "exe_cache")},
    )
    stock = diffusers.StableDiffusionPipeline.from_pretrained(sd_folder)
    assert isinstance(ours, diffusers.StableDiffusionPipeline)
    expected = _images(stock, height=SIZE, width=SIZE)
    assert expected.shape == (1, SIZE, SIZE, 3) and expected.std() > 0.01
    np.testing.assert_array_equal(_images(ours, height=SIZE, width=SIZE), expected)
    # the comparison can fail: another seed gives other images
    assert np.abs(_images(ours, seed=1, height=SIZE, width=SIZE) - expected).max() > 0.01
    ours.detach_from_device()  # releases nothing here: the pipeline still runs
    np.testing.assert_array_equal(_images(ours, height=SIZE, width=SIZE), expected)
    # Optimum Graphcore's IPU configs: the UNet's on 4 IPUs, the others on the host with n_ipu=4
    unet = ours.ipu_configs["unet"]
    assert isinstance(unet, IPUConfig) and unet.mode == "inference"
    assert unet.ipus_per_replica == 4 and unet.matmul_proportion == [0.6, 0.6, 0.1, 0.3]
    assert unet.executable_cache_dir == str(tmp_path / "exe_cache") and unet.inference_device_iterations == 1
    assert [ours.ipu_configs[name] for name in ("text_encoder", "vae", "safety_checker")] == [None, None, None]


def test_num_images_per_prompt_is_each_calls_default(sd_folder):
    ours = IPUStableDiffusionPipeline.from_pretrained(sd_folder, num_prompts=1, num_images_per_prompt=2)
    stock = diffusers.StableDiffusionPipeline.from_pretrained(sd_folder)
    images = _images(ours, height=SIZE, width=SIZE)
    assert images.shape == (2, SIZE, SIZE, 3)
    np.testing.assert_array_equal(images, _images(stock, height=SIZE, width=SIZE, num_images_per_prompt=2))
    assert _images(ours, height=SIZE, width=SIZE, num_images_per_prompt=1).shape[0] == 1  # a call's own wins
    assert ours.ipu_configs["unet"].inference_device_iterations == 2  # num_prompts x num_images_per_prompt


def test_img2img_takes_init_image_as_the_notebook_passes_it(sd_folder):
    ours = IPUStableDiffusionImg2ImgPipeline.from_pretrained(sd_folder, n_ipu=4, num_prompts=1)
    stock = diffusers.StableDiffusionImg2ImgPipeline.from_pretrained(sd_folder)
    start = _picture(0)
    expected = _images(stock, image=start, strength=0.75)  # without image=, diffusers would raise: it counts
    assert expected.shape == (1, SIZE, SIZE, 3) and expected.std() > 0.01
    np.testing.assert_array_equal(_images(ours, init_image=start, strength=0.75), expected)
    with pytest.raises(TypeError, match="init_image= is the old name of image=: pass one of them"):
        ours(PROMPT, image=start, init_image=start)


def test_inpainting_is_diffusers(inpaint_folder):
    ours = IPUStableDiffusionInpaintPipeline.from_pretrained(inpaint_folder, n_ipu=4, num_prompts=1)
    stock = diffusers.StableDiffusionInpaintPipeline.from_pretrained(inpaint_folder)
    assert ours.unet.config.in_channels == 9
    from PIL import Image

    mask = Image.new("L", (SIZE, SIZE), 0)
    mask.paste(255, (0, 0, SIZE // 2, SIZE))  # repaint the left half
    arguments = {"image": _picture(2), "mask_image": mask, "height": SIZE, "width": SIZE}
    expected = _images(stock, **arguments)
    assert expected.shape == (1, SIZE, SIZE, 3) and expected.std() > 0.01
    np.testing.assert_array_equal(_images(ours, **arguments), expected)


def test_settings_and_half_precision_on_a_cpu_are_said_once_at_load(sd_folder, caplog, monkeypatch):
    monkeypatch.setattr(diffusion, "cpu_supports_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        pipe = IPUStableDiffusionPipeline.from_pretrained(
            sd_folder, torch_dtype=torch.float16, n_ipu=4, num_prompts=1, num_images_per_prompt=1
        )
        for _ in range(2):
            _images(pipe, height=SIZE, width=SIZE, num_inference_steps=1)
    ours = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    dtype_lines = [m for m in ours if "torch_dtype=torch.float16 runs in torch.float32 on cpu" in m]
    settings = [m for m in ours if "Optimum Graphcore's IPU settings compile nothing here" in m]
    assert len(dtype_lines) == 1 and "no native half precision matrix units (AVX512-BF16 or AMX)" in dtype_lines[0]
    assert len(settings) == 1 and len(ours) == 2 and all("\n" not in m for m in ours)
    assert "n_ipu=4: all on cpu" in settings[0] and "num_images_per_prompt=1: the default of each call" in settings[0]
    assert pipe.unet.dtype == torch.float32 and pipe.text_encoder.dtype == torch.float32

    monkeypatch.setattr(diffusion, "cpu_supports_bf16", lambda: True)  # AVX512-BF16 / AMX: bf16 instead
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        pipe = IPUStableDiffusionPipeline.from_pretrained(sd_folder, torch_dtype=torch.float16)
    assert pipe.unet.dtype == torch.bfloat16 and pipe.vae.dtype == torch.bfloat16
    assert [m for m in caplog.messages if "torch_dtype=torch.float16 runs in torch.bfloat16 on cpu" in m]
    assert _images(pipe, height=SIZE, width=SIZE, num_inference_steps=1).shape == (1, SIZE, SIZE, 3)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):  # fp32 asked: nothing to say about precision
        IPUStableDiffusionPipeline.from_pretrained(sd_folder)
    assert not [m for m in caplog.messages if "torch_dtype" in m]


def test_two_devices_put_the_unet_alone_with_accelerate_hooks(sd_folder, monkeypatch):
    """Two distinct device objects (here both the CPU): the hooks that move tensors between components."""
    unet_device, other_device = torch.device("cpu", 0), torch.device("cpu")
    monkeypatch.setattr(diffusion, "component_devices", lambda n_ipu, device=None: (unet_device, other_device))
    ours = IPUStableDiffusionPipeline.from_pretrained(sd_folder, n_ipu=8)
    assert ours.hf_device_map == {"vae": "cpu", "text_encoder": "cpu", "unet": "cpu:0"}
    assert ours.unet._hf_hook.execution_device == unet_device and ours.vae._hf_hook.execution_device == other_device
    stock = diffusers.StableDiffusionPipeline.from_pretrained(sd_folder)
    np.testing.assert_array_equal(_images(ours, height=SIZE, width=SIZE), _images(stock, height=SIZE, width=SIZE))
    with pytest.raises(ValueError, match="device mapping strategy"):  # diffusers' own refusal of .to()
        ours.to("cpu")
    ours.reset_device_map()  # diffusers' way back to one device
    assert ours.hf_device_map is None and not hasattr(ours.unet, "_hf_hook")


def test_devices_chosen_by_n_ipu_and_the_devices_present(monkeypatch):
    def present(kind, count, world_size=1):
        monkeypatch.setattr(diffusion, "detect_devices", lambda: DeviceInfo(kind, count, [kind] * count, world_size))
        monkeypatch.setattr(diffusion, "default_device", lambda: torch.device(kind, 0) if kind != "cpu" else "cpu")

    present("cuda", 2)
    assert diffusion.component_devices(4) == (torch.device("cuda", 0), torch.device("cuda", 1))
    assert diffusion.component_devices(1) == (torch.device("cuda", 0), torch.device("cuda", 0))  # n_ipu=1: one
    assert diffusion.component_devices(4, "cuda:1") == (torch.device("cuda", 1), torch.device("cuda", 1))
    present("cuda", 2, world_size=2)  # torchrun: this process's own device
    assert diffusion.component_devices(4) == (torch.device("cuda", 0), torch.device("cuda", 0))
    present("cuda", 1)
    assert diffusion.component_devices(64) == (torch.device("cuda", 0), torch.device("cuda", 0))
    assert diffusion.dtype_on(torch.device("cuda", 0), torch.float16) == (torch.float16, None)
    monkeypatch.setattr(diffusion, "supports_bf16", lambda: False)
    dtype, why = diffusion.dtype_on(torch.device("cuda", 0), torch.bfloat16)
    assert dtype == torch.float16 and "as this GPU does not compute bfloat16" in why


def test_ipu_configs_are_optimum_graphcores():
    sd1 = SimpleNamespace(cross_attention_dim=768, sample_size=64)
    unet, text_encoder, vae, safety_checker = get_default_ipu_configs(sd1, n_ipu=8, num_prompts=2, foo=1)
    assert unet == {**diffusion._UNET_512, "foo": 1, "inference_device_iterations": 2}
    assert text_encoder == {"ipus_per_replica": 1, "matmul_proportion": 0.6, "foo": 1, "inference_device_iterations": 2}
    assert vae["ipus_per_replica"] == 2 and safety_checker["ipus_per_replica"] == 1
    sd2_768 = SimpleNamespace(cross_attention_dim=1024, sample_size=96)
    assert get_default_ipu_configs(sd2_768, n_ipu=16)[0]["attn_matrix_target_mem_mb"] == 45
    configs = diffusion.build_ipu_configs(
        sd1, 8, 1, 3, {"executable_cache_dir": "cache"}, vae_ipu_config={"ipus_per_replica": 1}
    )
    assert configs["vae"].ipus_per_replica == 1 and configs["vae"].executable_cache_dir == "cache"
    assert configs["unet"].inference_device_iterations == 3 and configs["text_encoder"].inference_device_iterations == 1
    given = IPUConfig(ipus_per_replica=2)
    assert diffusion.build_ipu_configs(sd1, unet_ipu_config=given)["unet"] == given.copy().eval()
    with pytest.raises(ValueError, match="n_ipu=3 is not a valid value for a Pod type"):
        get_default_ipu_configs(sd1, n_ipu=3)
    with pytest.raises(TypeError, match="`common_ipu_config_kwargs` must be a dict"):
        diffusion.build_ipu_configs(sd1, common_ipu_config_kwargs=["executable_cache_dir"])


def test_text_to_image_task_returns_the_images(sd_folder):
    generate = pipeline("text-to-image", model=sd_folder, num_inference_steps=2, height=SIZE, width=SIZE)
    stock = diffusers.StableDiffusionPipeline.from_pretrained(sd_folder)
    images = generate(PROMPT, generator=torch.Generator().manual_seed(0))
    expected = stock(
        PROMPT, num_inference_steps=2, height=SIZE, width=SIZE, generator=torch.Generator().manual_seed(0)
    ).images
    assert isinstance(images, list) and len(images) == 1 and images[0].size == (SIZE, SIZE)
    np.testing.assert_array_equal(np.asarray(images[0]), np.asarray(expected[0]))
    assert isinstance(generate.diffusion, IPUStableDiffusionPipeline) and generate.diffusion.unet.dtype == torch.float32
    with pytest.raises(ValueError, match="does not take max_seq_length, batch_size"):
        pipeline("text-to-image", model=sd_folder, max_seq_length=16, batch_size=2)
    with pytest.raises(ValueError, match="has no default model; pass model= a diffusers folder"):
        pipeline("text-to-image")


NO_DIFFUSERS = """
import sys
import optimum_ipu, optimum_ipu.diffusers, optimum_ipu.pipelines
assert "diffusers" not in sys.modules, "import optimum_ipu imported diffusers"
sys.modules["diffusers"] = None  # as if it were not installed
try:
    from optimum_ipu.diffusers import IPUStableDiffusionPipeline
except ImportError as err:
    print("import:", err)
try:
    optimum_ipu.pipeline("text-to-image", model="folder")
except ImportError as err:
    print("pipeline:", err)
"""


def test_without_diffusers_one_line_names_the_extra():
    run = subprocess.run([sys.executable, "-c", NO_DIFFUSERS], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    message = 'needs diffusers, which is not installed: pip install "optimum-ipu[diffusers]"'
    assert [line.split(": ", 1)[0] for line in run.stdout.splitlines()] == ["import", "pipeline"], run.stdout
    assert all(line.endswith(message) for line in run.stdout.splitlines()), run.stdout
