"""Solo: a latency-first LLM inference engine for one request at a time."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# PyTorch's CPU allocator backs allocations of 2 MiB and more with transparent huge pages when this is set
# (read at its first allocation, so it only takes effect when solo is imported before torch allocates, as
# in the CLI and the server). Decode streams every weight once per token; with 4 KiB pages the TLB misses
# (two-level page walks in a VM) cost a 2-core AMD EPYC VM about a quarter of its GEMV bandwidth.
# THP_MEM_ALLOC_ENABLE=0 in the environment keeps PyTorch's default.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

if TYPE_CHECKING:
    from solo.engine.engine import Engine
    from solo.engine.request import GenerationEvent, GenerationResult, GenerationStats
    from solo.engine.sampling import SamplingParams
    from solo.errors import SoloError

__all__ = ["Engine", "GenerationEvent", "GenerationResult", "GenerationStats", "SamplingParams", "SoloError"]
__version__ = "0.1.0"

# Imported on first use (PEP 562), so `solo --help` and `solo --version` do not pay for importing torch.
_LAZY = {
    "Engine": "solo.engine.engine",
    "GenerationEvent": "solo.engine.request",
    "GenerationResult": "solo.engine.request",
    "GenerationStats": "solo.engine.request",
    "SamplingParams": "solo.engine.sampling",
    "SoloError": "solo.errors",
}


def __getattr__(name: str) -> Any:  # noqa: ANN401
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'solo' has no attribute {name!r}")
