"""The folders of this process's cgroups, where Linux keeps the limits a container or a systemd unit sets.

A limit binds at every level: the process's own cgroup and each parent (a systemd slice's MemoryMax= or
CPUQuota=, a container's), so a reader takes the tightest over the chain `cgroup_folders` returns. cgroup v2
keeps every controller in one tree; v1 mounts one tree per controller (or per group of them, such as
"cpu,cpuacct"). Inside a container the mount shows the container's own cgroup as the tree's root while
/proc/self/cgroup may still name the host's path; the chain's parents then include that root, so the
container's limit is read either way. Used by solo.memory (memory limits) and solo.cpus (CPU quotas).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

CGROUP_ROOT = "/sys/fs/cgroup"
"""Where the cgroup trees are mounted (v2: the tree itself; v1: one folder per controller under it)."""

SELF_CGROUP = "/proc/self/cgroup"
"""This process's cgroup path in each tree ("hierarchy-id:controllers:path" lines; v2's controllers are empty)."""


class CgroupFolders(NamedTuple):
    """The process's cgroup folder and each parent up to the mount, in the v2 tree and in a v1 controller's.

    Attributes:
        v2: folders of the v2 tree (own first, the root last); they may not exist (no v2 tree mounted).
        v1: the same in the v1 tree of the controller asked for.
    """

    v2: list[Path]
    v1: list[Path]


def cgroup_folders(controller: str, root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP) -> CgroupFolders:
    """The process's cgroup folders for `controller` ("memory", "cpu"), its own folder first, then each parent.

    The v1 tree is `root`/`controller` when that folder exists, else the folder named after the whole group
    the controller is mounted with (`root`/cpu,cpuacct). An unreadable `self_cgroup` counts as the root cgroup.
    Nothing here raises: folders that do not exist are returned, and reading them fails as the caller handles.
    """
    v2_path, v1_path, v1_group = "/", "/", controller
    try:
        for line in Path(self_cgroup).read_text(encoding="ascii").splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                v2_path = path.strip()
            elif controller in controllers.split(","):
                v1_path, v1_group = path.strip(), controllers
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    v1_base = Path(root) / controller
    if not v1_base.is_dir() and (Path(root) / v1_group).is_dir():
        v1_base = Path(root) / v1_group
    return CgroupFolders(_chain(Path(root), v2_path), _chain(v1_base, v1_path))


def _chain(base: Path, path: str) -> list[Path]:
    # The cgroup's folder under `base`, then each parent up to `base` itself.
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
