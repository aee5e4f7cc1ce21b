"""Decode runtimes: how a prefill or decode step executes (eager reference, compiled CPU, CUDA graphs)."""

from __future__ import annotations

import logging

import torch

from solo.errors import SoloError
from solo.model.transformer import Transformer
from solo.runtime.base import DecodeRuntime
from solo.runtime.eager import EagerRuntime

BACKENDS = ("auto", "eager", "cpu", "cuda-graph")
"""Values accepted for `backend` / `--backend`."""

_log = logging.getLogger(__name__)


def create_runtime(model: Transformer, backend: str, device: torch.device) -> DecodeRuntime:
    """Pick the runtime for a device.

    "auto" on the CPU is the native CPU runtime (`solo.runtime.cpu`) when it supports the model, else
    the eager runtime (the reason is logged); on CUDA it is the CUDA-graph runtime
    (`solo.runtime.cuda.runtime`).

    Args:
        model: the loaded eager model (or a quantized one from `solo.runtime.quant.quantize_model`).
        backend: "auto" (fastest available for the device) or a name from `BACKENDS`.
        device: the model's device.

    Raises:
        SoloError: an unknown backend name, or "cpu" asked for a model it cannot run.
    """
    if backend not in BACKENDS:
        raise SoloError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    device = torch.device(device)
    if backend == "cpu" or (backend == "auto" and device.type == "cpu"):
        from solo.runtime.cpu import CpuRuntime, cpu_unsupported_reason

        reason = cpu_unsupported_reason(model)
        if reason is None:
            return CpuRuntime(model)
        if backend == "cpu":
            raise SoloError(f"the cpu backend cannot run this model: {reason}")
        _log.warning("using the eager runtime: %s", reason)
    if backend == "cuda-graph" or (backend == "auto" and device.type == "cuda"):
        from solo.runtime.cuda.runtime import CudaGraphRuntime, unsupported_reason

        reason = unsupported_reason(model)
        if reason is None:
            return CudaGraphRuntime(model)
        if backend == "cuda-graph":
            raise SoloError(f"the cuda-graph backend cannot run this model: {reason}")
        _log.warning("using the eager runtime: %s", reason)
    return EagerRuntime(model)
