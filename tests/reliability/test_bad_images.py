"""Images that cannot be read are refused by their name where they are decoded (issue 28, item 3): a path that is
not there is reported as missing (not as "Incorrect image source. Must be a valid URL"), with the nearest name in its
folder; a folder, a FIFO or a dangling link as what it is; a truncated, corrupted, empty or non-image file with its
name; in `load_image`, in `pipeline("image-classification")` and in the image example script (one line, exit 2)."""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import PIL.Image
import pytest
import torch
import transformers

from optimum_ipu.pipelines.images import ImageDecodingError, load_image, read_image_file

from ..conftest import REPO_ROOT
from ..examples.test_run_image_classification import TINY
from .test_script_errors import load_script, one_clear_line, run_main

RAW_ERROR = "Incorrect image source"


def _image(path, rng: random.Random, fmt: str = "PNG"):
    pixels = np.array([[rng.randrange(256) for _ in range(3 * 24)] for _ in range(24)], dtype=np.uint8)
    PIL.Image.fromarray(pixels.reshape(24, 24, 3)).save(path, format=fmt)
    return path


def _damaged(path, how: str, rng: random.Random):
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[: rng.randrange(1, len(data) // 2)]
    elif how == "corrupted":  # the header's magic bytes changed: no decoder takes it
        for at in range(0, 4):
            data[at] ^= rng.randint(1, 255)
    elif how == "empty":
        data = bytearray()
    else:  # text under an image name
        data = bytearray(b"not an image at all\n" * rng.randint(1, 5))
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize("how", ["truncated", "corrupted", "empty", "text"])
def test_a_damaged_file_is_named(tmp_path, reliability, fmt, how):
    rng = random.Random(f"{fmt}{how}")
    name = f"img-{rng.randrange(10**6)}.{fmt.lower()}"
    path = _damaged(_image(tmp_path / name, rng, fmt), how, rng)
    for call in (lambda: load_image(str(path)), lambda: load_image(path), lambda: load_image({"path": str(path)})):
        err = reliability.expect_clear_error(call, (name, "image"), (ImageDecodingError,))
        assert RAW_ERROR not in str(err)
    reliability.expect_clear_error(lambda: load_image(path.read_bytes()), "the image bytes", (ImageDecodingError,))


def test_a_missing_path_is_reported_as_missing(tmp_path, reliability):
    rng = random.Random(7)
    for _ in range(5):
        name = "".join(rng.choice("abcdefghij_-/") for _ in range(rng.randint(3, 30))).strip("/") + ".png"
        path = str(tmp_path / name)
        err = reliability.expect_clear_error(lambda path=path: load_image(path), (path, "no such image file"))
        assert RAW_ERROR not in str(err) and isinstance(err, ImageDecodingError)
    _image(tmp_path / "cat-photo.png", rng)
    err = reliability.expect_clear_error(lambda: load_image(str(tmp_path / "cat-photp.png")), "no such image file")
    assert "did you mean cat-photo.png" in str(err)


@pytest.mark.parametrize("kind", ["folder", "fifo", "dangling link"])
def test_a_path_that_is_not_an_image_file_says_what_it_is(tmp_path, reliability, kind):
    path = tmp_path / f"photo-{kind.replace(' ', '-')}.png"
    if kind == "folder":
        path.mkdir()
        said = "a folder"
    elif kind == "fifo":
        os.mkfifo(path)
        said = "a FIFO"
    else:
        path.symlink_to(tmp_path / "gone.png")
        said = "a symbolic link to"
    reliability.expect_clear_error(lambda: read_image_file(path), (str(path), said), (ImageDecodingError,))


def test_whole_images_and_base64_still_load(tmp_path):
    import base64

    rng = random.Random(3)
    path = _image(tmp_path / "ok.png", rng)
    expected = np.asarray(PIL.Image.open(path).convert("RGB"))
    encoded = base64.b64encode(path.read_bytes()).decode()
    for source in (str(path), path, {"path": None, "bytes": path.read_bytes()}, encoded, PIL.Image.open(path)):
        assert np.array_equal(np.asarray(load_image(source)), expected)
    assert np.array_equal(np.asarray(load_image("data:image/png;base64," + encoded)), expected)


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37
    )
    folder = tmp_path_factory.mktemp("vit")
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    transformers.ViTImageProcessorPil(size={"height": 16, "width": 16}).save_pretrained(folder)
    return str(folder)


def test_the_pipeline_names_the_file(vit_dir, tmp_path, reliability):
    from optimum_ipu import pipeline

    classifier = pipeline("image-classification", model=vit_dir, ipu_config={"layers_per_ipu": [1, 1]})
    rng = random.Random(11)
    good = str(_image(tmp_path / "good.png", rng))
    assert len(classifier(good, top_k=2)) == 2
    missing = str(tmp_path / f"missing-{rng.randrange(1000)}.jpg")
    err = reliability.expect_clear_error(lambda: classifier(missing), (missing, "no such image file"))
    assert RAW_ERROR not in str(err)
    bad = str(_damaged(_image(tmp_path / "bad.png", rng), "truncated", rng))
    reliability.expect_clear_error(lambda: classifier([good, bad]), (bad, "cannot be decoded"))


def test_the_example_script_ends_in_one_line_naming_the_file(shared_data, tmp_path, reliability):
    digits = shared_data / "images" / "uci-digits-8x8" / "train"
    train = tmp_path / "train"
    rng = random.Random(5)
    for label in ("0", "1"):
        (train / label).mkdir(parents=True)
        for name in sorted(os.listdir(digits / label))[:4]:
            shutil.copy(digits / label / name, train / label / name)
    victim = rng.choice(sorted(train.glob("*/*.png")))  # all 8 are in the one step's batch
    _damaged(victim, rng.choice(["truncated", "corrupted", "text"]), rng)
    script = load_script(REPO_ROOT / "examples" / "image-classification", "run_image_classification")
    argv = ["--model_type", "vit", "--config_overrides", TINY["vit"], "--train_dir", str(train), "--do_train"]
    argv += ["--per_device_train_batch_size", "8", "--output_dir", str(tmp_path / "out"), "--report_to", "none"]
    argv += ["--train_val_split", "0", "--max_steps", "1"]
    code, stderr = run_main(script, argv)
    one_clear_line(reliability, code, stderr, (victim.name, "cannot be decoded"))
