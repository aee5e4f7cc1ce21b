"""Decode tokens/s against context length for Solo, its peers and the roofline (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from solo.errors import SoloError

MISSING_MATPLOTLIB = '--plot needs matplotlib: pip install matplotlib (from a checkout: pip install -e ".[plot]")'


def require_matplotlib(path: str | Path | None = None) -> None:
    """Fail early, before a long sweep, when --plot cannot draw (to `path`).

    Raises:
        SoloError: matplotlib is not installed, or it cannot write the format `path`'s suffix names.
    """
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise SoloError(MISSING_MATPLOTLIB)
    if path is not None:
        from matplotlib.figure import Figure

        formats = Figure().canvas.get_supported_filetypes()
        suffix = Path(path).suffix.lstrip(".").lower()
        if suffix and suffix not in formats:  # (no suffix: matplotlib's default, PNG)
            raise SoloError(f"--plot {path}: matplotlib writes {', '.join('.' + f for f in sorted(formats))}; name "
                            "the file with one of them (e.g. out.png)")


def plot_sweep(sweep: dict[str, Any], title: str, path: str | Path) -> None:
    """Draw the context sweep and save it as an image.

    Args:
        sweep: {"contexts": [int], "roofline_tokens_per_s": [float], "engines": {name: [tok/s or None]}}, and
            optionally "point_roofline_tokens_per_s": [float] (drawn dotted).
        title: the figure title.
        path: output file (.png, .svg, ...).

    Raises:
        SoloError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SoloError(MISSING_MATPLOTLIB) from None
    contexts = sweep["contexts"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(contexts, sweep["roofline_tokens_per_s"], "k--", label="roofline (measured bandwidth)")
    if sweep.get("point_roofline_tokens_per_s"):
        ax.plot(contexts, sweep["point_roofline_tokens_per_s"], "k:", label="roofline (bandwidth probed at each point)")
    for name, values in sweep["engines"].items():
        points = [(c, v) for c, v in zip(contexts, values, strict=True) if v is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens in the KV cache)")
    ax.set_ylabel("decode tokens/s (batch 1)")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)
    plt.close(fig)
