"""`ipu_config.json` on the Hugging Face Hub: download (with the cache and offline mode of `huggingface_hub`) and
upload. Part of the config layer: no torch, no other layer of the package.
"""

from __future__ import annotations

import logging
from typing import Any

from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from .config_schema import CONFIG_NAME
from .errors import IncompatibleIPUConfigError, short_repr

logger = logging.getLogger(__name__)

# what `from_pretrained` passes on to the download, with `transformers`' older name of the token
DOWNLOAD_OPTIONS = ("token", "force_download", "local_files_only", "proxies")

# The Hub cannot be reached (offline mode, no network) and the file is not in the cache: a bundled file may serve.
# (LocalEntryNotFoundError is also an EntryNotFoundError: it is checked first.)
UNREACHABLE = (LocalEntryNotFoundError, ConnectionError, TimeoutError)
# The Hub answered: no such repository, revision or file.
NOT_ON_THE_HUB = (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError, HFValidationError)


def download_config_file(
    repo_id: str, filename: str = CONFIG_NAME, *, revision: str | None = None, cache_dir: Any = None, **options: Any
) -> tuple[str | None, str | None]:
    """The path of `filename` of a Hub repository, downloaded into the cache (or read from it offline).

    Args:
        repo_id (`str`): a model repository id, e.g. `"Graphcore/gpt2-medium-ipu"`.
        filename (`str`, *optional*, defaults to `"ipu_config.json"`): the file, with its subfolder if any.
        revision (`str`, *optional*): a branch, tag or commit.
        cache_dir (`str`, *optional*): the Hugging Face cache to use.
        options: `token` (or `use_auth_token`), `force_download`, `local_files_only`, `proxies`.

    Returns:
        `(path, None)` when found; `(None, why)` when the Hub cannot be reached and the file is not cached, or the
        Hub has no such repository, revision or file.

    Raises:
        IncompatibleIPUConfigError: one line for the other errors (a refused token, a server error, a cache that
            cannot be written, a file name `huggingface_hub` refuses), naming the repository and the fix.
    """
    if "use_auth_token" in options and options.get("token") is None:
        options["token"] = options.pop("use_auth_token")
    kwargs = {k: options[k] for k in DOWNLOAD_OPTIONS if options.get(k) is not None}
    try:
        path = hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache_dir, **kwargs)
    except UNREACHABLE as error:
        return None, f"the Hub cannot be reached and {repo_id!r} is not in the local cache ({type(error).__name__})"
    except NOT_ON_THE_HUB as error:
        return None, f"the Hub has no {filename} for {repo_id!r}{_at(revision)} ({type(error).__name__})"
    except HfHubHTTPError as error:  # an answer other than "not found": a refused token, a server error
        status = getattr(getattr(error, "response", None), "status_code", None)
        raise IncompatibleIPUConfigError(
            f"{short_repr(repo_id)}{_at(revision)}: the Hub refused {filename} (HTTP {status or '?'}: "
            f"{_first_line(error)}); check the token (HF_TOKEN or `hf auth login`) and the id, or try again later"
        ) from None
    except OSError as error:  # the cache: no space, no permission
        raise IncompatibleIPUConfigError(
            f"{short_repr(repo_id)}: cannot fetch {filename} into the Hugging Face cache ({error.strerror or error}); "
            "check cache_dir / HF_HOME (space, permissions) and the token"
        ) from None
    except ValueError as error:  # a file name or option huggingface_hub refuses
        raise IncompatibleIPUConfigError(
            f"{short_repr(repo_id)}: cannot download {short_repr(filename)} ({_first_line(error)})"
        ) from None
    return path, None


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return short_repr(lines[0], 100).strip("'\"") if lines else type(error).__name__


def push_config_to_hub(
    json_text: str,
    repo_id: str,
    *,
    commit_message: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
) -> Any:
    """Upload `ipu_config.json` to a Hub repository (created if needed), as `PretrainedConfig.push_to_hub` does.

    Returns the `CommitInfo` of `huggingface_hub.HfApi.upload_file`.
    """
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    return api.upload_file(
        path_or_fileobj=json_text.encode("utf-8"),
        path_in_repo=CONFIG_NAME,
        repo_id=repo_id,
        commit_message=commit_message or "Upload IPU config",
        revision=revision,
        create_pr=create_pr,
    )


def _at(revision: str | None) -> str:
    return f" at revision {revision!r}" if revision else ""
