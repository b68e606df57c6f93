"""Where an IPU config is looked for, every error is the project's one line (issue 28, item 6): a `subfolder` that
leaves the folder or repository (`..`, an absolute path) is refused before anything is read or downloaded (not
`huggingface_hub`'s "Invalid filename"); an `ipu_config.json` inside a folder that is a FIFO, a folder or a dangling
link is reported as what it is (not as absent); a config file that links to another file with unknown keys does not
echo that file's keys; the Hub's other refusals (a token refused, a server error, a cache that cannot be written)
name the repository and the fix."""

from __future__ import annotations

import errno
import json
import os
import random
import string

import pytest
from huggingface_hub.errors import HfHubHTTPError

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig
from optimum_ipu.config_hub import download_config_file

CLEAR = (IncompatibleIPUConfigError,)


def _escaping_subfolders(rng: random.Random, count: int) -> list[str]:
    """Subfolders that leave their folder: a `..` part anywhere (with either separator), or an absolute path."""
    found = []
    for _ in range(count):
        parts = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 6))) for _ in range(rng.randint(0, 3))]
        parts.insert(rng.randint(0, len(parts)), "..")
        separator = rng.choice(["/", "\\"])
        found.append(separator.join(parts))
    found.append("/" + "/".join(rng.choices(["etc", "tmp", "x"], k=2)))
    return found


@pytest.mark.parametrize("where", ["folder", "hub id", "bundled id"])
def test_a_subfolder_that_leaves_the_folder_is_one_line(tmp_path, reliability, where):
    IPUConfig(seed=3).save_pretrained(tmp_path / "model" / "inner")
    name = {"folder": str(tmp_path / "model"), "hub id": "someone/some-model", "bundled id": "Graphcore/bert-base-ipu"}
    for subfolder in _escaping_subfolders(random.Random(where), 6):
        err = reliability.expect_clear_error(
            lambda s=subfolder: IPUConfig.from_pretrained(name[where], subfolder=s),
            ("subfolder", repr(subfolder)),
            CLEAR,
        )
        assert "Invalid filename" not in str(err) and "repository owner" not in str(err)
    assert IPUConfig.from_pretrained(str(tmp_path / "model"), subfolder="inner").seed == 3  # inside: read


def test_the_auto_classes_refuse_such_a_subfolder_too(tmp_path, reliability):
    from optimum_ipu import AutoModelForSequenceClassification

    for subfolder in _escaping_subfolders(random.Random(9), 4):
        for name in (str(tmp_path), "someone/some-model"):
            load = lambda n=name, s=subfolder: AutoModelForSequenceClassification.from_pretrained(n, subfolder=s)  # noqa: E731
            err = reliability.expect_clear_error(load, ("subfolder", repr(subfolder)), CLEAR)
            assert "Invalid filename" not in str(err)


@pytest.mark.parametrize("kind", ["fifo", "folder", "dangling link"])
def test_a_config_file_that_is_no_file_is_said_as_what_it_is(tmp_path, reliability, kind):
    folder = tmp_path / "model"
    folder.mkdir()
    target = folder / "ipu_config.json"
    said = {"fifo": "a FIFO (named pipe)", "folder": "a folder", "dangling link": "a symbolic link to"}[kind]
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    else:
        target.symlink_to(tmp_path / "gone.json")
    err = reliability.expect_clear_error(lambda: IPUConfig.from_pretrained(str(folder)), (str(target), said), CLEAR)
    assert "has no ipu_config.json" not in str(err)


def test_a_link_to_another_file_does_not_echo_its_keys(tmp_path, reliability):
    rng = random.Random(1)
    for trial in range(4):
        secret_keys = [
            "".join(rng.choices(string.ascii_letters, k=rng.randint(6, 14))) for _ in range(rng.randint(1, 5))
        ]
        foreign = tmp_path / f"credentials-{trial}.json"
        values = {key: rng.randint(0, 9) for key in secret_keys}
        if rng.random() < 0.5:
            values["seed"] = 1  # a known key among them does not make the file an IPU config
        foreign.write_text(json.dumps(values))
        folder = tmp_path / f"model-{trial}"
        folder.mkdir()
        link = folder / "ipu_config.json"
        link.symlink_to(foreign)
        for name in (str(folder), str(link)):
            err = reliability.expect_clear_error(
                lambda n=name: IPUConfig.from_pretrained(n), (str(link), "link"), CLEAR
            )
            assert not any(key in str(err) for key in secret_keys), err
    # a link to a real config is read as the config
    IPUConfig(seed=11).save_pretrained(tmp_path / "real")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "ipu_config.json").symlink_to(tmp_path / "real" / "ipu_config.json")
    assert IPUConfig.from_pretrained(str(tmp_path / "linked")).seed == 11


class _Response:
    """What `HfHubHTTPError` reads of an HTTP response."""

    def __init__(self, status: int) -> None:
        self.status_code, self.headers, self.request = status, {}, None


def _http_error(status: int) -> HfHubHTTPError:
    return HfHubHTTPError(f"{status} Client Error\nmore detail", response=_Response(status))


@pytest.mark.parametrize(
    ("error", "names"),
    [
        (lambda: _http_error(401), ("HTTP 401", "token")),
        (lambda: _http_error(503), ("HTTP 503", "try again later")),
        (lambda: OSError(errno.ENOSPC, "No space left on device"), ("No space left", "cache_dir")),
        (lambda: PermissionError(errno.EACCES, "Permission denied"), ("Permission denied", "HF_HOME")),
        (lambda: ValueError("Invalid filename 'x': the repository owner\nmust rename it"), ("cannot download",)),
    ],
)
def test_the_hubs_other_refusals_are_one_line(monkeypatch, reliability, error, names):
    def refuse(*args, **kwargs):
        raise error()

    monkeypatch.setattr("optimum_ipu.config_hub.hf_hub_download", refuse)
    repo = "org-" + "".join(random.Random(str(names)).choices(string.ascii_lowercase, k=8)) + "/model"
    reliability.expect_clear_error(lambda: download_config_file(repo), (repo, *names), CLEAR)
    reliability.expect_clear_error(lambda: IPUConfig.from_pretrained(repo), (repo, *names), CLEAR)
