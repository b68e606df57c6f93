"""A stand-in for the Hugging Face Hub's upload API (no machine of the tests reaches the Hub), for workers that call
`Trainer.push_to_hub` / `hub_strategy`: `install(folder)` replaces `HfApi.create_repo` and `HfApi.upload_folder`;
each upload becomes one commit, `folder/<repo>/commit-<n>/`, holding the files `upload_folder` would have sent (its
own pattern filter, `huggingface_hub.utils.filter_repo_objects`), copied when the call is made."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import huggingface_hub
from huggingface_hub.utils import filter_repo_objects


def commits(folder: str | os.PathLike, repo_id: str) -> list[Path]:
    """The commits made to `repo_id`, oldest first."""
    repo = Path(folder) / repo_id
    return sorted(repo.glob("commit-*"), key=lambda path: int(path.name.split("-")[1])) if repo.is_dir() else []


def install(folder: str) -> None:
    def create_repo(self: Any, repo_id: str, **kwargs: Any) -> huggingface_hub.RepoUrl:
        os.makedirs(os.path.join(folder, repo_id), exist_ok=True)
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}", endpoint="https://huggingface.co")

    def upload_folder(
        self: Any,
        *,
        repo_id: str,
        folder_path: str,
        allow_patterns: Any = None,
        ignore_patterns: Any = None,
        run_as_future: bool = False,
        **kwargs: Any,
    ) -> Any:
        files = [str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file()]
        sent = filter_repo_objects(files, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns)
        commit = Path(folder) / repo_id / f"commit-{len(commits(folder, repo_id))}"
        for name in sent:
            (commit / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(os.path.join(folder_path, name), commit / name)
        info = huggingface_hub.CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/{commit.name}",
            commit_message=kwargs.get("commit_message") or "",
            commit_description="",
            oid=commit.name,
        )
        if not run_as_future:
            return info
        done: Future = Future()
        done.set_result(info)
        return done

    huggingface_hub.HfApi.create_repo = create_repo
    huggingface_hub.HfApi.upload_folder = upload_folder
