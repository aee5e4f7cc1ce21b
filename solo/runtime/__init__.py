"""Decode runtimes: how a prefill or decode step executes (eager reference, compiled CPU, CUDA graphs)."""

from __future__ import annotations

import importlib
import logging

import torch

from solo.errors import SoloError
from solo.model.transformer import Transformer
from solo.runtime.base import DecodeRuntime
from solo.runtime.eager import EagerRuntime

BACKENDS = ("auto", "eager", "cpu", "cuda-graph", "megakernel")
"""Values accepted for `backend` / `--backend`."""

_log = logging.getLogger(__name__)


def create_runtime(model: Transformer, backend: str, device: torch.device) -> DecodeRuntime:
    """Pick the runtime for a device.

    "auto" on the CPU is the native CPU runtime (`solo.runtime.cpu`, or `solo.runtime.cpu_lanes` for lane
    models) when it supports the model, else the eager runtime (the reason is logged; lane models off the
    CPU run eager); on CUDA it is the CUDA-graph runtime
    (`solo.runtime.cuda.runtime`). "megakernel" (`solo.runtime.megakernel`, one persistent CUDA kernel
    per N tokens) is only used when asked for.

    Args:
        model: the loaded eager model (or a quantized one from `solo.runtime.quant.quantize_model`).
        backend: "auto" (fastest available for the device) or a name from `BACKENDS`.
        device: the model's device.

    Returns:
        A `DecodeRuntime` wrapping `model` (the CPU and CUDA runtimes re-point its q/k/v and gate/up
        parameters to fused buffers, values unchanged).

    Raises:
        SoloError: an unknown backend name, or "cpu" / "cuda-graph" / "megakernel" asked for a model it
            cannot run (e.g. "the megakernel backend cannot run this model: the megakernel backend needs a
            CUDA GPU").
    """
    if backend not in BACKENDS:
        raise SoloError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    device = torch.device(device)
    if getattr(model.config, "lanes", None) is not None:
        return _lane_runtime(model, backend, device)
    for name, device_type, module_name, class_name, reason_name in _FAST_RUNTIMES:
        if backend != name and not (backend == "auto" and device.type == device_type):
            continue
        module = importlib.import_module(module_name)
        reason = getattr(module, reason_name)(model)
        if reason is None:
            return getattr(module, class_name)(model)
        if backend == name:
            raise SoloError(f"the {name} backend cannot run this model: {reason}")
        _log.warning("using the eager runtime: %s", reason)
    return EagerRuntime(model)


def _lane_runtime(model: Transformer, backend: str, device: torch.device) -> DecodeRuntime:
    # Lane models (solo.model.lanes): the native CPU runtime (solo.runtime.cpu_lanes) on the CPU, the eager
    # runtime elsewhere or where the native one cannot run them (the reason is logged).
    if backend not in ("auto", "eager", "cpu"):
        raise SoloError(f"the {backend} backend cannot run lane models (Laneformer); use --backend auto, cpu or eager")
    if backend == "eager":
        return EagerRuntime(model)
    if backend == "auto" and device.type != "cpu":
        _log.warning("using the eager runtime: lane models (Laneformer) have no fast runtime on %s yet", device.type)
        return EagerRuntime(model)
    from solo.runtime.cpu_lanes import CpuLaneRuntime, cpu_lanes_unsupported_reason

    reason = cpu_lanes_unsupported_reason(model)
    if reason is None:
        return CpuLaneRuntime(model)
    if backend == "cpu":
        raise SoloError(f"the cpu backend cannot run this model: {reason}")
    _log.warning("using the eager runtime: %s", reason)
    return EagerRuntime(model)


# backend name, the device type it is "auto" for, module, runtime class, function giving why it cannot run a
# model (None when it can). Imported lazily: the CUDA runtime pulls in Triton.
_FAST_RUNTIMES = (
    ("cpu", "cpu", "solo.runtime.cpu", "CpuRuntime", "cpu_unsupported_reason"),
    ("cuda-graph", "cuda", "solo.runtime.cuda.runtime", "CudaGraphRuntime", "unsupported_reason"),
    # Never "auto" until a GPU run shows it correct and fastest (device type None matches no device).
    ("megakernel", None, "solo.runtime.megakernel.runtime", "MegakernelRuntime", "unsupported_reason"),
)
