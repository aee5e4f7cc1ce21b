"""A local Hugging Face cache folder laid out as huggingface_hub lays it out (blobs, snapshots, refs)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "a" * 40


def add_to_cache(cache: Path, repo_id: str, folder: Path, commit: str = COMMIT, ref: str = "main") -> Path:
    """Put every file of `folder` into `cache` as revision `commit` of `repo_id`; returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in folder.iterdir():
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


def use_offline_cache(cache: Path, monkeypatch) -> None:  # noqa: ANN001
    """Point huggingface_hub at `cache`, offline (a download that is not cached fails at once)."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
