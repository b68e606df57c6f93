"""`IPUConfig` and the Hub: downloads through `huggingface_hub` (mocked here: no machine of the tests reaches the
Hub), the cache and the bundled copies offline, uploads with `push_to_hub`."""

from __future__ import annotations

import json

import httpx2  # huggingface_hub's HTTP client: its errors carry a response
import pytest
from huggingface_hub.errors import RepositoryNotFoundError

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig, config_hub


def test_an_id_is_downloaded_with_the_loading_options(tmp_path, monkeypatch):
    IPUConfig(gradient_accumulation_steps=12).save_pretrained(tmp_path / "hub")
    asked = {}

    def fake_download(repo_id, filename, **kwargs):
        asked.update(repo_id=repo_id, filename=filename, **kwargs)
        return str(tmp_path / "hub" / "ipu_config.json")

    monkeypatch.setattr(config_hub, "hf_hub_download", fake_download)
    config = IPUConfig.from_pretrained(
        "someone/my-ipu", revision="v1", cache_dir=str(tmp_path / "cache"), use_auth_token="hf_x", subfolder="sub"
    )
    assert config.gradient_accumulation_steps == 12
    assert asked == {
        "repo_id": "someone/my-ipu",
        "filename": "sub/ipu_config.json",
        "revision": "v1",
        "cache_dir": str(tmp_path / "cache"),
        "token": "hf_x",  # transformers' older name of the token is passed on as `token`
    }


def test_offline_a_graphcore_id_comes_from_the_bundled_copy_and_an_unknown_id_is_one_clear_error():
    # the tests run with HF_HUB_OFFLINE=1 and an empty cache for these ids: huggingface_hub's own offline path
    assert IPUConfig.from_pretrained("Graphcore/gpt2-medium-ipu").layers_per_ipu == [3, 7, 7, 7]
    with pytest.raises(IncompatibleIPUConfigError) as error:
        IPUConfig.from_pretrained("someone/not-cached-ipu")
    message = str(error.value)
    assert (
        "'someone/not-cached-ipu'" in message and "Hub unreachable" in message and "not in the local cache" in message
    )
    assert "check the id" in message and "\n" not in message


def test_an_id_the_hub_does_not_have_is_said_so(monkeypatch):
    def missing(repo_id, filename, **kwargs):
        response = httpx2.Response(404, request=httpx2.Request("GET", "https://huggingface.co/someone/typo-ipu"))
        raise RepositoryNotFoundError("404 Client Error: Repository Not Found", response=response)

    monkeypatch.setattr(config_hub, "hf_hub_download", missing)
    with pytest.raises(IncompatibleIPUConfigError, match="'someone/typo-ipu': the Hub has no ipu_config.json for it"):
        IPUConfig.from_pretrained("someone/typo-ipu")
    # a Graphcore id the Hub does not serve falls back to the bundled copy
    assert IPUConfig.from_pretrained("Graphcore/bert-base-ipu").layers_per_ipu == [0, 4, 4, 4]


def test_other_hub_errors_are_not_hidden_and_one_line(monkeypatch):
    def refused(repo_id, filename, **kwargs):
        raise PermissionError("401: invalid token")  # not an "unreachable" or "not found": the user must see it

    monkeypatch.setattr(config_hub, "hf_hub_download", lambda *a, **k: refused(*a, **k))
    with pytest.raises(IncompatibleIPUConfigError, match="someone/private-ipu.*invalid token"):  # one line
        IPUConfig.from_pretrained("someone/private-ipu", token="bad")


class FakeApi:
    calls: list = []

    def __init__(self, token=None):
        self.token = token

    def create_repo(self, repo_id, private=None, exist_ok=False):
        FakeApi.calls.append(("create_repo", repo_id, private, exist_ok, self.token))

    def upload_file(self, path_or_fileobj, path_in_repo, repo_id, commit_message, revision, create_pr):
        FakeApi.calls.append(("upload_file", json.loads(path_or_fileobj), path_in_repo, repo_id, commit_message))
        return "commit-info"


def test_push_to_hub_uploads_the_json(tmp_path, monkeypatch):
    FakeApi.calls = []
    monkeypatch.setattr(config_hub, "HfApi", FakeApi)
    config = IPUConfig(layers_per_ipu=[1, 3], gradient_accumulation_steps=8)
    assert config.push_to_hub("me/bert-ipu", private=True, token="hf_w") == "commit-info"
    create, upload = FakeApi.calls
    assert create == ("create_repo", "me/bert-ipu", True, True, "hf_w")
    assert upload[2:] == ("ipu_config.json", "me/bert-ipu", "Upload IPU config")
    assert IPUConfig.from_dict(upload[1]) == config
    FakeApi.calls = []
    path = config.save_pretrained(tmp_path / "bert-ipu", push_to_hub=True)
    assert path.is_file() and FakeApi.calls[1][3] == "bert-ipu"  # repo_id defaults to the folder's name
