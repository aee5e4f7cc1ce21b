"""Solo: a latency-first LLM inference engine for one request at a time."""

from solo.engine.engine import Engine
from solo.engine.request import GenerationEvent, GenerationResult, GenerationStats
from solo.engine.sampling import SamplingParams
from solo.errors import SoloError

__all__ = ["Engine", "GenerationEvent", "GenerationResult", "GenerationStats", "SamplingParams", "SoloError"]
__version__ = "0.1.0"
