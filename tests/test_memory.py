"""Host memory: MemAvailable within a container's cgroup limit (solo.memory), as every host KV cache checks it."""

from __future__ import annotations

import pytest
from cgroup_files import self_cgroup as _self_cgroup
from cgroup_files import write_files as _write

import solo.memory as memory
from solo.errors import KVCacheMemoryError


def test_cgroup_v2_room_counts_inactive_file_pages_as_free_and_takes_the_tightest_parent(tmp_path):
    root = tmp_path / "fs"
    own = root / "system.slice" / "solo.service"
    _write(own, memory_max="1000000\n", memory_current="700000\n", memory_stat="anon 500000\ninactive_file 300000\n")
    me = _self_cgroup(tmp_path, "0::/system.slice/solo.service\n")
    # 1000000 - (700000 - 300000): reclaimable page cache does not count against the limit
    assert memory.cgroup_room_bytes(str(root), me) == 600_000
    _write(root / "system.slice", memory_max="500000\n", memory_current="450000\n", memory_stat="inactive_file 0\n")
    assert memory.cgroup_room_bytes(str(root), me) == 50_000  # the slice's limit binds the service too
    _write(own, memory_max="max\n")
    _write(root / "system.slice", memory_max="max\n")
    assert memory.cgroup_room_bytes(str(root), me) is None
    _write(root, memory_max="2000\n", memory_current="3000\n")  # over its limit (no stat): no room, never negative
    assert memory.cgroup_room_bytes(str(root), me) == 0


def test_cgroup_v1_memory_controller_path_and_its_no_limit_value(tmp_path):
    root = tmp_path / "fs"
    folder = root / "memory" / "docker" / "abc"
    _write(folder, memory_limit_in_bytes="8000000\n", memory_usage_in_bytes="5000000\n",
           memory_stat="cache 3000000\ntotal_inactive_file 1000000\n")
    me = _self_cgroup(tmp_path, "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    assert memory.cgroup_room_bytes(str(root), me) == 4_000_000
    _write(folder, memory_limit_in_bytes="9223372036854771712\n")  # v1's "no limit"
    assert memory.cgroup_room_bytes(str(root), me) is None
    assert memory.cgroup_room_bytes(str(tmp_path / "absent"), str(tmp_path / "absent-self")) is None


def test_host_memory_is_the_smaller_figure_and_names_it(monkeypatch):
    monkeypatch.setattr(memory, "meminfo_available_bytes", lambda: 8 << 30)
    monkeypatch.setattr(memory, "cgroup_room_bytes", lambda: 2 << 30)
    assert memory.host_memory() == (2 << 30, "the container's memory limit")
    monkeypatch.setattr(memory, "cgroup_room_bytes", lambda: None)
    assert memory.host_memory() == (8 << 30, "MemAvailable")
    monkeypatch.setattr(memory, "meminfo_available_bytes", lambda: None)
    assert memory.host_memory() == (None, "unknown")


def test_a_kv_cache_beyond_the_containers_limit_is_refused_with_that_limit_named(monkeypatch):
    monkeypatch.setattr(memory, "meminfo_available_bytes", lambda: 64 << 30)  # the host's, seen from a container
    monkeypatch.setattr(memory, "cgroup_room_bytes", lambda: 1 << 30)
    with pytest.raises(KVCacheMemoryError, match=r"needs 2\.00 GiB but 1\.00 GiB of memory is available "
                                                 r"\(the container's memory limit\); ask for fewer tokens"):
        memory.check_kv_cache_fits(2 << 30, 4, 32768)
    memory.check_kv_cache_fits(1 << 29, 4, 8192)  # fits: no error
