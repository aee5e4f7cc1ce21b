"""Decode runtimes: how a prefill or decode step executes (eager reference, compiled CPU, CUDA graphs)."""

from __future__ import annotations

import torch

from solo.errors import SoloError
from solo.model.transformer import Transformer
from solo.runtime.base import DecodeRuntime
from solo.runtime.eager import EagerRuntime

BACKENDS = ("auto", "eager")
"""Values accepted for `backend` / `--backend`."""


def create_runtime(model: Transformer, backend: str, device: torch.device) -> DecodeRuntime:
    """Pick the runtime for a device.

    Args:
        model: the loaded eager model.
        backend: "auto" (fastest available for the device) or a name from `BACKENDS`.
        device: the model's device.

    Raises:
        SoloError: an unknown backend name.
    """
    if backend not in BACKENDS:
        raise SoloError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return EagerRuntime(model)
