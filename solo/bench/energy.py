"""Energy per token: joules read from a hardware energy counter over a window of repeated decode runs.

Counters:
- NVIDIA GPUs: NVML's total energy counter (`nvmlDeviceGetTotalEnergyConsumption`, millijoules since the
  driver loaded; Volta and newer) through `nvidia-ml-py`. It covers the whole board.
- CPUs: Intel RAPL / AMD's RAPL-compatible counters under /sys/class/powercap (`energy_uj` of each package
  domain, microjoules, wrapping at `max_energy_range_uj`), where the files are readable (often root only).
  It covers the whole package: other work on the machine during the window is counted too.

Elsewhere (a VM without powercap, a GPU without NVML) energy is "not measurable here", never estimated.
The window is several seconds because the counters update every few to tens of milliseconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POWERCAP = Path("/sys/class/powercap")


@dataclass
class EnergyCounter:
    """A cumulative energy counter.

    Attributes:
        name: what is measured ("RAPL package-0 + package-1", "NVML GPU 0").
        read_j: returns the counter in joules (monotonic within a window; wraps are undone by `measure`).
        wrap_j: the value at which the counter wraps, in joules (None: never within a window).
    """

    name: str
    read_j: Callable[[], float]
    wrap_j: float | None = None


def _rapl_domains(root: Path) -> list[Path]:
    # Top-level package domains (intel-rapl:0, intel-rapl:1, ...); sub-domains (intel-rapl:0:0) are parts of them.
    return sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1 and (p / "energy_uj").exists())


def rapl_counter(root: Path = POWERCAP) -> tuple[EnergyCounter | None, str]:
    """The CPU packages' RAPL energy, or (None, why not)."""
    domains = _rapl_domains(root)
    if not domains:
        return None, f"no RAPL counters under {root} (a VM or a kernel without powercap)"
    try:
        for d in domains:
            int((d / "energy_uj").read_text())
        wrap = sum(int((d / "max_energy_range_uj").read_text()) for d in domains) / 1e6 if all(
            (d / "max_energy_range_uj").exists() for d in domains) else None
    except (OSError, ValueError) as exc:
        return None, f"RAPL counters under {root} are not readable ({exc.__class__.__name__}; often root only)"
    names = [(d / "name").read_text().strip() if (d / "name").exists() else d.name for d in domains]
    if len(domains) > 1:
        wrap = None  # several counters wrap independently: read them one by one (see measure)

    def read() -> float:
        return sum(int((d / "energy_uj").read_text()) for d in domains) / 1e6

    return EnergyCounter("RAPL " + " + ".join(names), read, wrap), ""


def nvml_counter(device: Any) -> tuple[EnergyCounter | None, str]:  # noqa: ANN401
    """The NVIDIA GPU's NVML energy counter for a torch CUDA device, or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        handle = None
        try:
            import torch

            uuid = str(torch.cuda.get_device_properties(device).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
        except Exception:  # noqa: BLE001  # older torch without .uuid: NVML's index (ignores CUDA_VISIBLE_DEVICES)
            handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        name = pynvml.nvmlDeviceGetName(handle)
    except pynvml.NVMLError as exc:
        return None, f"NVML has no energy counter for this GPU ({exc})"
    return EnergyCounter(f"NVML {name if isinstance(name, str) else name.decode()}",
                         lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3), ""


def open_counter(device: Any) -> tuple[EnergyCounter | None, str]:  # noqa: ANN401
    """The energy counter for a torch device: NVML on CUDA, RAPL on CPU; else (None, the reason)."""
    if getattr(device, "type", "cpu") == "cuda":
        return nvml_counter(device)
    return rapl_counter()


def measure(counter: EnergyCounter, run: Callable[[], int], window_s: float = 5.0) -> dict[str, Any]:
    """Repeat `run` for at least `window_s` seconds and divide the energy by the tokens it generated.

    Args:
        counter: an energy counter (see `open_counter`).
        run: one generation; returns the number of tokens it generated.
        window_s: the shortest window, in seconds.

    Returns:
        joules, tokens, seconds, joules_per_token, tokens_per_joule, mean watts, the counter's name.
    """
    tokens = 0
    start_j = last_j = counter.read_j()
    total_j = 0.0
    start = time.perf_counter()
    while True:
        tokens += run()
        now_j = counter.read_j()
        step = now_j - last_j
        if step < 0 and counter.wrap_j:
            step += counter.wrap_j
        total_j += max(step, 0.0)
        last_j = now_j
        elapsed = time.perf_counter() - start
        if elapsed >= window_s:
            break
    _ = start_j
    return {
        "counter": counter.name, "joules": total_j, "tokens": tokens, "seconds": elapsed,
        "joules_per_token": total_j / tokens if tokens else None,
        "tokens_per_joule": tokens / total_j if total_j > 0 else None,
        "mean_watts": total_j / elapsed if elapsed > 0 else None,
    }
