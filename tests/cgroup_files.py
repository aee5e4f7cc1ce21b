"""Fake cgroup trees for the tests of solo.memory and solo.cpus: limit files and a /proc/self/cgroup."""

from __future__ import annotations

from pathlib import Path


def write_files(folder: Path, **files: str) -> None:
    """Write `files` into `folder` (made if missing); a name's first "_" is its ".": cpu_max -> cpu.max."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def self_cgroup(tmp_path: Path, text: str) -> str:
    """The path of a file holding `text` as /proc/self/cgroup would."""
    path = tmp_path / "self-cgroup"
    path.write_text(text)
    return str(path)
