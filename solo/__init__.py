"""Solo: a latency-first LLM inference engine for one request at a time."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
