"""The Triton tuner's on-disk cache (solo/runtime/triton/tuning.py): where it lives, and writers sharing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from solo.runtime.triton import tuning


def test_the_cache_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("SOLO_TUNING_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tuning.cache_path() == tmp_path / "solo" / "triton_tuning.json"
    monkeypatch.setenv("SOLO_TUNING_CACHE", str(tmp_path / "mine.json"))
    assert tuning.cache_path() == tmp_path / "mine.json"


def test_two_processes_storing_at_once_keep_every_entry(tmp_path):
    # Two GPU servers tuning at once shared one temporary file name and no lock: 198 and 168 of 600 entries survived.
    path = tmp_path / "tuning.json"
    script = ("import sys\nfrom solo.runtime.triton import tuning\n"
              "for i in range(150):\n    tuning._store_disk(f'{sys.argv[1]}-{i}', {'i': i})\n")
    env_path = {"SOLO_TUNING_CACHE": str(path)}
    procs = [subprocess.Popen([sys.executable, "-c", script, name], env={**os.environ, **env_path},
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    errors = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0] and not any("could not write" in e for e in errors), errors
    data = json.loads(path.read_text())
    assert len(data) == 300 and not list(tmp_path.glob("*.tmp"))


def test_the_file_keeps_others_readable_and_is_never_replaced_unread(tmp_path, monkeypatch):
    # mkstemp's 0600 shut other users out (their next write replaced every entry with their one); a file that cannot
    # be read was replaced by one entry; a JSON list crashed the store.
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("SOLO_TUNING_CACHE", str(path))
    path.write_text("[1, 2]")
    tuning._store_disk("a", {"i": 1})
    assert json.loads(path.read_text()) == {"a": {"i": 1}}
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    read_text = type(path).read_text

    def unreadable(self, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied")
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(type(path), "read_text", unreadable)
    tuning._store_disk("b", {"i": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"a": {"i": 1}}


def test_a_link_loop_at_the_cache_path_is_a_warning_not_a_crash(tmp_path, monkeypatch, caplog):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    monkeypatch.setenv("SOLO_TUNING_CACHE", str(tmp_path / "loop1"))
    tuning._store_disk("k", {})  # (Path.resolve raised RuntimeError out of the tuner)
    assert "the tuning cache" in caplog.text and "WARNING" in caplog.text
