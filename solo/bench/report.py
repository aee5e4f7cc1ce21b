"""What a benchmark report records besides its numbers: the machine, the versions, summary statistics."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from solo.cpus import cgroup_cpu_limit, cpus_text


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(device: torch.device) -> dict[str, Any]:
    """CPU model, core count, threads used, the CPU quota, memory and (on CUDA) the GPU's name.

    `cpu_quota` is the cgroup's CPU limit in CPUs (`solo.cpus.cgroup_cpu_limit`), None without one: a run
    inside a container limited to fewer CPUs than it sees probes and decodes at the quota's pace.
    """
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_quota": cgroup_cpu_limit(),
        "os": platform.system(),
    }
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 1024**3, 1)
    return info


def machine_line(m: dict[str, Any]) -> str:
    """The "machine: ..." line of a printed report, from `machine_info`'s dict."""
    quota = m.get("cpu_quota")
    return (f"machine: {m['cpu']}, {m['cpu_cores']} cores, {m['torch_threads']} threads"
            + (f", CPU quota {cpus_text(quota)} (cgroup)" if quota is not None else "")
            + (f", GPU {m['gpu']}" if "gpu" in m else ""))


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Versions of Python and every package a result depends on (None when not installed)."""
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "solo": _version("solo"),
        "triton": _version("triton"),
        "llama-cpp-python": _version("llama-cpp-python"),
        "gguf": _version("gguf"),
    }


def report_command(argv: list[str] | None = None) -> str:
    """The command line a report records: `solo ...` however it was started, absolute paths cut to their names.

    `python -m solo.cli bench ...` and a virtual environment's `.../bin/solo` both read `solo bench ...`; an
    argument such as `--json /home/me/runs/x.json` or `--json=/home/me/runs/x.json` reads `--json x.json`, so a
    result file never quotes the local paths of the machine or the shell that wrote it; arguments are quoted
    as a POSIX shell needs (`shlex.join`).

    Args:
        argv: the process's arguments (default: sys.argv).

    Returns:
        The command, e.g. "solo bench --shape Qwen2.5-0.5B --json x.json".
    """
    argv = list(sys.argv if argv is None else argv)

    def cut(arg: str) -> str:
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("-") and os.path.isabs(value):
            return f"{flag}={Path(value).name}"
        return report_name(arg)

    return shlex.join(["solo", *(cut(a) for a in argv[1:])])


def report_name(model: str) -> str:
    """A model (or any argument) as a report names it: an absolute path cut to its last name, else as given."""
    return Path(model).name if os.path.isabs(model) else model


def summarize(values: list[float]) -> dict[str, float]:
    """Median, min and max of a list of measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratio_by_memory_speed(ratios: list[float], probes_gbps: list[list[float]],
                          spread: float = 1.3) -> dict[str, Any] | None:
    """Turn-by-turn speed ratios split by the memory speed probed around both turns of each pair.

    On a VM whose read bandwidth jumps between spells (35 and 68 GB/s on one 2-vCPU EPYC), a run's ratio is
    mostly the mix of spells it met: where memory is slow both engines sit near the roofline and differ by
    their efficiency there; where it is fast the kernels' other limits show. The split is at the midpoint
    of the slowest and fastest probe; a pair counts as slow (fast) when every probe around its two turns is
    below (at or above) it, and as neither when the speed changed between them.

    Args:
        ratios: Solo's tok/s over the peer's, one per pair of turns.
        probes_gbps: the read bandwidths probed around the pair's two turns (GB/s), one list per pair.
        spread: the fastest over the slowest probe below which there is one speed (None is returned).

    Returns:
        None for steady memory (or no pairs), else {"split_gbps", "slow": summarize(...) | None, "slow_turns",
        "fast": ..., "fast_turns", "mixed_turns"}.

    Raises:
        ValueError: the lists differ in length.
    """
    if len(ratios) != len(probes_gbps):
        raise ValueError(f"{len(ratios)} ratios but {len(probes_gbps)} probe lists")
    every = [b for probes in probes_gbps for b in probes]
    if not ratios or not every or min(every) <= 0 or max(every) < spread * min(every):
        return None
    split = (min(every) + max(every)) / 2
    slow = [r for r, probes in zip(ratios, probes_gbps, strict=True) if probes and max(probes) < split]
    fast = [r for r, probes in zip(ratios, probes_gbps, strict=True) if probes and min(probes) >= split]
    return {"split_gbps": split, "slow": summarize(slow) if slow else None, "slow_turns": len(slow),
            "fast": summarize(fast) if fast else None, "fast_turns": len(fast),
            "mixed_turns": len(ratios) - len(slow) - len(fast)}


def rss_bytes() -> tuple[int, int]:
    """(current, peak) resident memory of this process in bytes (0, 0 where /proc is missing)."""
    current = peak = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                current = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    except OSError:
        pass
    return current, peak


def write_output(flag: str, value: str, text: str) -> None:
    """Write a results file (`--json`, `--markdown`) whole or not at all.

    The text goes to a temporary file beside it, then is renamed over it: a full disk or a quota leaves the
    earlier file (or none) instead of an empty or cut one.

    Args:
        flag: the flag's name for the message ("--json").
        value: the path given.
        text: the file's whole content (UTF-8).

    Raises:
        SoloError: the file could not be written; the message names it and why.
    """
    import tempfile

    from solo.errors import SoloError

    path = Path(value).expanduser()
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.resolve().parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise SoloError(f"cannot write {flag} {value} ({exc.strerror or exc}); free space or give another "
                        "path") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_output_path(flag: str, value: str) -> None:
    """Refuse, before a benchmark runs, an output file its results could not be written to.

    Args:
        flag: the flag's name for the message ("--json").
        value: the path given.

    Raises:
        SoloError: the path is a folder, its folder does not exist, or it cannot be written (a read-only folder).
    """
    from solo.errors import SoloError

    path = Path(value).expanduser()
    if path.is_dir():
        raise SoloError(f"{flag} {value} is a folder; give a file name in it")
    if path.resolve().parent.exists() and not path.resolve().parent.is_dir():
        raise SoloError(f"{flag} {value}: {path.parent} is a file, not a folder")
    if not path.resolve().parent.is_dir():
        raise SoloError(f"{flag} {value}: the folder {path.parent} does not exist; create it first")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise SoloError(f"{flag} {value} cannot be written ({exc.strerror or exc}); give a writable path") from None
    if not existed:
        path.unlink()
