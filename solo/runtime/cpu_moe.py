"""The CPU runtime's mixture-of-experts part: the kernels' per-layer MoE description (`cpu_kernels/moe.h`).

The decode step routes and runs the experts natively (see moe.h for the algorithm); this module builds
the `MoeLayer` structs it reads: the router, expert 0's matrices plus the byte strides to the next
expert (the experts stay in the eager model's stacked [experts, rows, cols] tensors, dense or
`QuantExperts`, so nothing is copied), and the shared expert (Qwen2-MoE), whose gate and up are fused
into one matrix like a dense MLP's.

Prefill (`moe_prefill`): the router and top-k run as the eager block runs them (`solo.model.moe.route` over
the whole prompt, so the experts chosen, ties included, are eager's); the routed experts run natively
(`solo_moe_prefill` in moe.h: the prompt's tokens grouped by expert, each expert's rows as one product over
its tokens); a shared expert runs as the eager block's dense MLP.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from solo.model.config import ModelConfig
from solo.model.moe import SparseMoeBlock, route
from solo.model.transformer import Transformer
from solo.runtime.cpu import _W_BF16, _W_F32, _W_INT4, _W_INT4_BF16X, _W_INT8, _fuse_rows, _Mat
from solo.runtime.cpu_build import KernelBuildError
from solo.runtime.quant import QuantLinear
from solo.runtime.quant_moe import QuantExperts

MAX_EXPERTS = 1024  # moe.h routes with a stack array of this many logits


class _MoeLayer(ctypes.Structure):
    _fields_ = [("router", _Mat), ("gate_up", _Mat), ("down", _Mat)] + [
        (name, ctypes.c_int64) for name in ("gate_up_stride", "gate_up_scale_stride", "down_stride",
                                            "down_scale_stride")
    ] + [("shared_gate_up", _Mat), ("shared_down", _Mat), ("shared_gate", _Mat)] + [
        (name, ctypes.c_int32) for name in ("experts", "top_k", "inter", "shared_inter", "norm_topk_prob",
                                            "weights_fp32")
    ]


_layout_checked: set[int] = set()


def check_moe_struct_layout(lib: ctypes.CDLL) -> None:
    """Compare `_MoeLayer` with the `MoeLayer` the library was compiled with (`solo_moe_struct_layout`).

    Raises:
        KernelBuildError: the layouts differ.
    """
    if id(lib) in _layout_checked:
        return
    lib.solo_moe_struct_layout.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
    lib.solo_moe_struct_layout.restype = ctypes.c_int
    expected = [ctypes.sizeof(_MoeLayer)] + [getattr(_MoeLayer, name).offset for name, _ in _MoeLayer._fields_]
    buf = (ctypes.c_int64 * (len(expected) + 16))()
    count = lib.solo_moe_struct_layout(buf, len(buf))
    if list(buf[:min(count, len(buf))]) != expected:
        raise KernelBuildError("the CPU kernels' MoeLayer layout differs from solo/runtime/cpu_moe.py: update "
                               "cpu_kernels/moe.h and cpu_moe.py together")
    _layout_checked.add(id(lib))


def moe_unsupported_reason(model: Transformer | ModelConfig) -> str | None:
    """Why the CPU kernels cannot run this mixture-of-experts model (or config), or None when they can."""
    cfg = model if isinstance(model, ModelConfig) else model.config
    if cfg.num_experts > MAX_EXPERTS:
        return f"{cfg.num_experts} experts per layer is more than the CPU kernels route ({MAX_EXPERTS})"
    if max(cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size) > 32768:
        return (f"expert width {cfg.moe_intermediate_size} / shared expert width "
                f"{cfg.shared_expert_intermediate_size} is not supported by the CPU kernels (<= 32768)")
    return None


def _dense_mat(tensor: torch.Tensor, keep: list[torch.Tensor]) -> _Mat:
    tensor = tensor.detach()
    assert tensor.is_contiguous()
    keep.append(tensor)
    fmt = _W_BF16 if tensor.dtype == torch.bfloat16 else _W_F32
    return _Mat(fmt, tensor.shape[0], tensor.shape[1], 32, tensor.data_ptr(), None, None)


def _quant_format(mode: str, dtype: torch.dtype) -> int:
    if mode == "int8":
        return _W_INT8
    # bf16 activations: the bf16 dot-product int4 kernel is exact for them (as CpuRuntime._mat chooses)
    return _W_INT4_BF16X if dtype == torch.bfloat16 else _W_INT4


def _experts_mat(experts: torch.Tensor | QuantExperts, dtype: torch.dtype,
                 keep: list[torch.Tensor]) -> tuple[_Mat, int, int]:
    """(expert 0's matrix, bytes to the next expert's weight, bytes to its scales) of a stacked expert tensor."""
    if isinstance(experts, QuantExperts):
        q, scale = experts.qweight, experts.scale
        assert q.is_contiguous() and scale.is_contiguous()
        keep += [q, scale]
        mat = _Mat(_quant_format(experts.mode, dtype), q.shape[1], experts.in_features, 32, q.data_ptr(),
                   scale.data_ptr(), None)
        return mat, q.stride(0) * q.element_size(), scale.stride(0) * scale.element_size()
    weight = experts.detach()
    assert weight.is_contiguous(), "stacked expert weights must be contiguous"
    keep.append(weight)
    fmt = _W_BF16 if weight.dtype == torch.bfloat16 else _W_F32
    mat = _Mat(fmt, weight.shape[1], weight.shape[2], 32, weight.data_ptr(), None, None)
    return mat, weight.stride(0) * weight.element_size(), 0


def _fused_mat(modules: list[nn.Module], dtype: torch.dtype, keep: list[torch.Tensor]) -> _Mat:
    # As CpuRuntime._mat (rows concatenated, the eager modules re-pointed at views), without prefill's copy.
    first = modules[0]
    if isinstance(first, QuantLinear):
        qweight, scale, bias = _fuse_rows(modules, ("qweight", "scale", "bias"))
        fmt, cols = _quant_format(first.mode, dtype), first.in_features
    else:
        qweight, bias = _fuse_rows(modules, ("weight", "bias"))
        scale, cols = None, qweight.shape[1]
        fmt = _W_BF16 if qweight.dtype == torch.bfloat16 else _W_F32
    keep += [t for t in (qweight, scale, bias) if t is not None]
    return _Mat(fmt, qweight.shape[0], cols, 32, qweight.data_ptr(), scale.data_ptr() if scale is not None else None,
                bias.data_ptr() if bias is not None else None)


def build_moe_layers(model: Transformer, keep: list[torch.Tensor]) -> ctypes.Array:
    """The kernels' `MoeLayer [layers]` array for an MoE model (zeroed entries for its dense layers).

    Args:
        model: the eager MoE model, dense or from `quantize_model`.
        keep: list the referenced tensors are appended to (the caller keeps them alive).
    """
    cfg, dtype = model.config, model.dtype
    layers = (_MoeLayer * cfg.num_layers)()
    for i, layer in enumerate(model.layers):
        if not cfg.is_moe_layer(i):
            continue
        block, entry = layer.mlp, layers[i]
        entry.router = _dense_mat(block.router.weight, keep)
        entry.gate_up, entry.gate_up_stride, entry.gate_up_scale_stride = _experts_mat(block.gate_up_proj, dtype, keep)
        entry.down, entry.down_stride, entry.down_scale_stride = _experts_mat(block.down_proj, dtype, keep)
        if block.shared_expert is not None:
            shared = block.shared_expert
            entry.shared_gate_up = _fused_mat([shared.gate_proj, shared.up_proj], dtype, keep)
            entry.shared_down = _fused_mat([shared.down_proj], dtype, keep)
            entry.shared_gate = _dense_mat(block.shared_expert_gate.weight, keep)
            entry.shared_inter = cfg.shared_expert_intermediate_size
        entry.experts, entry.top_k, entry.inter = cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
        entry.norm_topk_prob, entry.weights_fp32 = int(cfg.norm_topk_prob), int(cfg.router_weights_fp32)
    return layers


def unread_expert_bytes(model: Transformer) -> int:
    """Bytes of routed experts a batch-1 decode step does not read: all but the top-k of every MoE layer."""
    cfg, total = model.config, 0
    for i, layer in enumerate(model.layers):
        if not cfg.is_moe_layer(i):
            continue
        for experts in (layer.mlp.gate_up_proj, layer.mlp.down_proj):
            nbytes = experts.nbytes() if isinstance(experts, QuantExperts) else experts.numel() * experts.element_size()
            total += nbytes // cfg.num_experts * (cfg.num_experts - cfg.num_experts_per_tok)
    return total


PREFILL_CHUNK_TOKENS = 512
"""Tokens per native call of `moe_prefill`: bounds its workspace (about 1.5 x tokens x top_k x hidden x 4
bytes, 50 MB at OLMoE's shape); a token's result does not depend on the chunking."""

_prefill_declared: set[int] = set()


def _declare_prefill(lib: ctypes.CDLL) -> None:
    if id(lib) in _prefill_declared:
        return
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.solo_moe_prefill_workspace_bytes.argtypes = [p, i, i, i]
    lib.solo_moe_prefill_workspace_bytes.restype = ctypes.c_size_t
    lib.solo_moe_prefill.argtypes = [p, i, p, i, p, p, p, p, i]
    lib.solo_moe_prefill.restype = None
    _prefill_declared.add(id(lib))


def moe_prefill(lib: ctypes.CDLL, model_struct: ctypes.Structure, layer: int, block: SparseMoeBlock,
                normed: torch.Tensor, num_threads: int) -> torch.Tensor:
    """The MoE MLP of one layer over a prompt, as `block(normed[None])[0]` computes it (up to summation order).

    Args:
        lib: the kernel library (`solo.runtime.cpu.checked_library`).
        model_struct: the runtime's `_Model` (its `moe` array describes `layer`).
        layer: the layer index (an MoE layer).
        block: that layer's eager `SparseMoeBlock` (router, shared expert).
        normed: [seq, hidden] normed inputs in the model's dtype.
        num_threads: threads of the native call.

    Returns:
        [seq, hidden] in the model's dtype.
    """
    _declare_prefill(lib)
    normed = normed.contiguous()
    seq = normed.shape[0]
    weights, ids = route(normed, block.router.weight, block.top_k, block.norm_topk_prob, block.weights_fp32)
    ids = ids.to(torch.int32).contiguous()
    weights = weights.float().contiguous()
    out = torch.empty_like(normed)
    struct = ctypes.byref(model_struct)
    chunk = min(seq, PREFILL_CHUNK_TOKENS)
    workspace = torch.empty(lib.solo_moe_prefill_workspace_bytes(struct, layer, chunk, num_threads),
                            dtype=torch.uint8)
    for start in range(0, seq, chunk):
        n = min(chunk, seq - start)
        lib.solo_moe_prefill(struct, layer, normed[start].data_ptr(), n, ids[start].data_ptr(),
                             weights[start].data_ptr(), out[start].data_ptr(), workspace.data_ptr(), num_threads)
    if block.shared_expert is not None:  # the eager block's own arithmetic
        out = out + torch.sigmoid(block.shared_expert_gate(normed)) * block.shared_expert(normed)
    return out
