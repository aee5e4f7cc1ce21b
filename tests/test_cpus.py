"""CPUs this process may use: the affinity mask and a container's CPU quota (solo.cpus, solo.cgroup)."""

from __future__ import annotations

import pytest
from cgroup_files import self_cgroup as _self_cgroup
from cgroup_files import write_files as _write

import solo.cpus as cpus
from solo.cgroup import cgroup_folders


def test_cgroup_v2_cpu_max_is_quota_over_period_and_the_tightest_parent_wins(tmp_path):
    root = tmp_path / "fs"
    own = root / "kubepods.slice" / "pod1"
    _write(own, cpu_max="150000 100000\n")
    me = _self_cgroup(tmp_path, "0::/kubepods.slice/pod1\n")
    assert cpus.cgroup_cpu_limit(str(root), me) == 1.5  # docker run --cpus 1.5
    _write(root / "kubepods.slice", cpu_max="50000 100000\n")
    assert cpus.cgroup_cpu_limit(str(root), me) == 0.5  # the parent's limit binds the pod too
    _write(own, cpu_max="max 100000\n")
    _write(root / "kubepods.slice", cpu_max="max 100000\n")
    assert cpus.cgroup_cpu_limit(str(root), me) is None
    _write(own, cpu_max="200000\n")  # no period written: the kernel's default, 100 ms
    assert cpus.cgroup_cpu_limit(str(root), me) == 2.0
    _write(own, cpu_max="garbage\n")
    assert cpus.cgroup_cpu_limit(str(root), me) is None


def test_cgroup_v1_cfs_quota_in_a_combined_cpu_cpuacct_tree(tmp_path):
    root = tmp_path / "fs"
    folder = root / "cpu,cpuacct" / "docker" / "abc"
    _write(folder, cpu_cfs_quota_us="100000\n", cpu_cfs_period_us="100000\n")
    me = _self_cgroup(tmp_path, "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    assert cgroup_folders("cpu", str(root), me).v1[0] == folder
    assert cpus.cgroup_cpu_limit(str(root), me) == 1.0
    _write(folder, cpu_cfs_quota_us="-1\n")  # v1's "no quota"
    assert cpus.cgroup_cpu_limit(str(root), me) is None
    # Inside a container the tree's root is the container's own cgroup while /proc/self/cgroup names the host's
    # path: the chain's last folder (the mount) is read.
    _write(root / "cpu,cpuacct", cpu_cfs_quota_us="25000\n", cpu_cfs_period_us="100000\n")
    assert cpus.cgroup_cpu_limit(str(root), me) == 0.25
    assert cpus.cgroup_cpu_limit(str(tmp_path / "absent"), str(tmp_path / "absent-self")) is None


@pytest.mark.parametrize(("limit", "threads"), [(0.1, 1), (1.0, 1), (1.2, 1), (1.4, 1), (1.5, 2), (2.0, 2),
                                                (2.5, 3), (15.7, 16)])
def test_threads_for_a_cpu_limit_round_to_the_nearest_cpu(limit, threads):
    assert cpus.threads_for_cpu_limit(limit) == threads


def test_threads_and_usable_cpus_within_the_quota(monkeypatch):
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 8)
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: None)
    assert (cpus.threads_within_cpu_limit(8), cpus.usable_cpus()) == (8, 8.0)
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: 2.5)
    assert (cpus.threads_within_cpu_limit(8), cpus.threads_within_cpu_limit(2), cpus.usable_cpus()) == (3, 2, 2.5)
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: 0.3)
    assert cpus.threads_within_cpu_limit(8) == 1
    assert [cpus.cpus_text(x) for x in (1.0, 1.5, 0.25, 2.0, 1.234, 0.001)] == [
        "1 CPU", "1.5 CPUs", "0.25 CPUs", "2 CPUs", "1.23 CPUs", "0.001 CPUs"]


def test_the_cpu_runtime_and_tp_ranks_default_to_the_quota(monkeypatch, tiny_llama):
    import torch

    import solo.distributed.launch as launch
    from solo.model.config import ModelConfig
    from solo.model.weights import load_weights
    from solo.runtime.cpu import CpuRuntime

    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: 1.0)
    model = load_weights(tiny_llama, ModelConfig.from_file(tiny_llama), torch.float32)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        runtime = CpuRuntime(model)
        # Decode steps within the 1-CPU quota (two would spin it away); a prompt's steps on both threads (after
        # an idle spell the period's quota is there to spend).
        assert runtime.num_threads == 2 and runtime.threads.decode_threads == 1
        assert runtime.threads.threads_for(1) == 1 and runtime.threads.threads_for(64) == 2
        monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: None)
        assert CpuRuntime(model).threads.threads_for(1) == 2
    finally:
        torch.set_num_threads(before)
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: 1.0)
    monkeypatch.setattr(launch, "affinity_cpus", lambda: 4)
    assert launch.default_threads(2) == 1
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: None)
    assert launch.default_threads(2) == 2


def test_the_servers_serving_line_names_threads_and_the_quota(monkeypatch):
    import torch

    import solo.server.state as state

    for module in (state, cpus):  # (the line's quota, and the decode cap it shares with the runtime)
        monkeypatch.setattr(module, "cgroup_cpu_limit", lambda: 1.0)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert state._cpu_threads_text(torch.device("cpu")) == ", 1 thread"
        torch.set_num_threads(2)
        assert state._cpu_threads_text(torch.device("cpu")) == ", 2 threads (1 for decode steps: CPU quota 1 CPU)"
        for module in (state, cpus):
            monkeypatch.setattr(module, "cgroup_cpu_limit", lambda: None)
        assert state._cpu_threads_text(torch.device("cpu")) == ", 2 threads"
    finally:
        torch.set_num_threads(before)
    assert state._cpu_threads_text(torch.device("cuda")) == ""
