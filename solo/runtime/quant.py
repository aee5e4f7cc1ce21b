"""Weight-only quantization: a pass that swaps the model's Linear layers for int8 or int4 ones.

As in gpt-fast's quantize.py, the model code has no quantization branches: `quantize_model` returns a
copy of the module tree (sharing the norms and the embedding) whose projection and LM-head Linear
layers are `QuantLinear`s. The CPU runtime streams their packed integers directly; anything else (eager
prefill, the eager runtime) calls `QuantLinear.forward`, which dequantizes and runs a normal matmul.

Formats (symmetric, round-to-nearest, no calibration data):
- int8: one float32 scale per output row, scale = max|w_row| / 127, q in [-127, 127].
- int4: one bf16 scale per group of 32 consecutive inputs, scale = c * max|w_group| / 7 with c in
  [0.75, 1] chosen per group for the least squared error, q in [-8, 7],
  stored as q + 8 in nibbles; byte i of a group holds input i (low nibble) and input i + 16 (high).
  This is the block layout of llama.cpp's Q4_0 (32 weights per scale), written independently.
q, k, v and gate, up are quantized as one fused matrix each, and the per-projection modules hold row
views of it, so the runtime reads them in one pass.
"""

from __future__ import annotations

import copy
import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from solo.errors import SoloError
from solo.model.transformer import Transformer

QUANT_MODES = ("int8", "int4")
"""Values accepted for `--quantize`."""

INT4_GROUP = 32
"""Inputs per int4 scale."""


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (per output channel) symmetric absmax int8, round to nearest (as gpt-fast's int8 weight-only).

    Args:
        weight: [out, in] float tensor (any float dtype).

    Returns:
        (q int8 [out, in], scale float32 [out]); weight ~= q * scale[:, None].
    """
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-wise (32 inputs) symmetric int4, packed two per byte (llama.cpp Q4_0's block layout).

    Each group's scale is absmax / 7 times the factor in {1, 0.95, ..., 0.75} with the least squared
    error (a small clipping search of Solo's own; llama.cpp's Q4_0 reference quantizer does not search).

    Args:
        weight: [out, in] float tensor; `in` must be a multiple of 32.

    Returns:
        (packed uint8 [out, in // 2], scale bfloat16 [out, in // 32]); byte i of group g of a row holds
        input 32g + i (low nibble) and 32g + i + 16 (high nibble), each stored as q + 8 with q in [-8, 7].

    Raises:
        SoloError: `in` is not a multiple of 32.
    """
    out_features, in_features = weight.shape
    if in_features % INT4_GROUP:
        raise SoloError(f"int4 needs input sizes that are multiples of {INT4_GROUP}; this model has {in_features}: use "
                        "--quantize int8, which takes any size")
    w = weight.float().view(out_features, in_features // INT4_GROUP, INT4_GROUP)
    absmax = w.abs().amax(dim=2).clamp_min(1e-12)
    # Per group, keep the scale (among shrunken absmax/7 candidates) with the least squared error:
    # clipping the rare largest weight a little buys a finer step for all the others.
    best_scale, best_err = None, None
    for shrink in (1.0, 0.95, 0.9, 0.85, 0.8, 0.75):
        scale = (absmax * (shrink / 7.0)).to(torch.bfloat16).float()
        err = ((torch.round(w / scale[:, :, None]).clamp(-8, 7) * scale[:, :, None] - w) ** 2).sum(dim=2)
        if best_scale is None:
            best_scale, best_err = scale, err
        else:
            better = err < best_err
            best_scale = torch.where(better, scale, best_scale)
            best_err = torch.where(better, err, best_err)
    scale = best_scale.to(torch.bfloat16)
    q = torch.round(w / scale.float()[:, :, None]).clamp_(-8, 7).to(torch.int16) + 8  # [out, groups, 32]
    packed = (q[:, :, :16] | (q[:, :, 16:] << 4)).to(torch.uint8)
    return packed.reshape(out_features, in_features // 2).contiguous(), scale.contiguous()


def quantize_activations_q8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU kernels' int8 activation quantization (cpu_kernels/qdot.h), as a reference.

    Per block of 32 consecutive inputs (the last block zero-padded): d = max|x| / 127 and
    q = round-half-even(x * (127 / max|x|)) clamped to [-127, 127], all in float32 (q = 0 for a zero block).
    The integer-dot kernels multiply q with the int8 / int4 weights exactly and scale by d per block.

    Args:
        x: [..., K] float tensor (any float dtype; computed in float32).

    Returns:
        (q int8 [..., 32 * ceil(K / 32)], d float32 [..., ceil(K / 32)]).
    """
    x = x.float()
    k = x.shape[-1]
    blocks = (k + INT4_GROUP - 1) // INT4_GROUP
    padded = F.pad(x, (0, blocks * INT4_GROUP - k)).reshape(*x.shape[:-1], blocks, INT4_GROUP)
    amax = padded.abs().amax(dim=-1)
    d = amax / 127.0
    # A true float32 division, as the kernels' 127.0f / amax (`127.0 / tensor` is computed as a reciprocal
    # times 127 in PyTorch, which rounds differently).
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / torch.where(amax > 0, amax, torch.ones_like(amax)),
                      torch.zeros_like(amax))
    q = torch.round(padded * inv[..., None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(*x.shape[:-1], blocks * INT4_GROUP), d


def fake_quantize_activations_q8(x: torch.Tensor) -> torch.Tensor:
    """The values q * d (float32 [..., K]) of x's int8 block quantization: what the integer-dot kernels multiply."""
    q, d = quantize_activations_q8(x)
    k = x.shape[-1]
    values = q.float().reshape(*d.shape, INT4_GROUP) * d[..., None]
    return values.reshape(*x.shape[:-1], -1)[..., :k]


def dequantize(mode: str, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of `quantize_int8` / `quantize_int4`: the [out, in] weight q * scale in `dtype`.

    Args:
        mode: "int8" or "int4".
        q: int8 [out, in] (int8) or packed uint8 [out, in // 2] (int4).
        scale: float32 [out] (int8) or bfloat16 [out, in // 32] (int4).
        dtype: dtype of the result.
    """
    if mode == "int8":
        return (q.float() * scale[:, None]).to(dtype)
    out_features = q.shape[0]
    groups = scale.shape[1]
    packed = q.view(out_features, groups, INT4_GROUP // 2).to(torch.int16)
    values = torch.cat((packed & 0xF, packed >> 4), dim=2).float() - 8.0  # [out, groups, 32]
    return (values * scale.float()[:, :, None]).reshape(out_features, groups * INT4_GROUP).to(dtype)


class QuantLinear(nn.Module):
    """A Linear layer with int8 or int4 weights (see the module docstring for the formats).

    Args:
        mode: "int8" or "int4".
        qweight: int8 [out, in] or packed uint8 [out, in // 2].
        scale: float32 [out] (int8) or bfloat16 [out, in // 32] (int4).
        bias: [out] in the activation dtype, or None.
        in_features: input size.
        dtype: activation dtype the dequantized weight is computed in.
    """

    def __init__(self, mode: str, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 in_features: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.mode = mode
        self.in_features = in_features
        self.out_features = qweight.shape[0]
        self.act_dtype = dtype
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        # True: forward quantizes its input as the CPU kernels' integer-dot path does (`set_int8_activations`).
        self.int8_activations = False

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight [out, in] in the activation dtype (built on every access).

        Uses the native kernel (memory-speed, multi-threaded) when it is available, else `dequantize`.
        """
        if self.qweight.device.type == "cpu" and self.act_dtype in (torch.bfloat16, torch.float32):
            native = _native_dequantize(self)
            if native is not None:
                return native
        return dequantize(self.mode, self.qweight, self.scale, self.act_dtype)

    def nbytes(self) -> int:
        """Bytes of the quantized weight and its scales (what a matrix-vector product reads)."""
        return self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * self.scale.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., in] -> [..., out] in the activation dtype: dequantize, then a dense matmul (prefill, eager).

        With `int8_activations`, x is first replaced by its int8 block quantization's values
        (`fake_quantize_activations_q8`, rounded back to x's dtype, as the CPU runtime's prefill does; its
        decode kernels multiply the unrounded values).
        """
        if self.int8_activations:
            x = fake_quantize_activations_q8(x).to(x.dtype)
        return F.linear(x, self.weight, self.bias)


def _native_dequantize(layer: QuantLinear) -> torch.Tensor | None:
    from solo.runtime.cpu_build import KernelBuildError, load_library

    try:
        lib = load_library()
    except KernelBuildError:
        return None
    from solo.runtime.cpu import native_matrix

    out = torch.empty(layer.out_features, layer.in_features, dtype=layer.act_dtype)
    mat = native_matrix(layer)
    lib.solo_dequantize(ctypes.byref(mat), out.data_ptr(), int(layer.act_dtype == torch.bfloat16),
                        torch.get_num_threads())
    return out


def _fused_quant(mode: str, linears: list[nn.Linear], dtype: torch.dtype) -> list[QuantLinear]:
    weight = torch.cat([lin.weight for lin in linears], dim=0)
    quantize = quantize_int8 if mode == "int8" else quantize_int4
    q, scale = quantize(weight)
    modules, start = [], 0
    for lin in linears:
        end = start + lin.weight.shape[0]
        bias = None if lin.bias is None else lin.bias.detach()
        modules.append(QuantLinear(mode, q[start:end], scale[start:end], bias, lin.in_features, dtype))
        start = end
    return modules


def _shallow_tree(module: nn.Module) -> nn.Module:
    # Copy the module objects but share every tensor, so swapping children leaves the original intact.
    clone = copy.copy(module)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    clone._modules = {name: _shallow_tree(child) if child is not None else None
                      for name, child in module._modules.items()}
    return clone


def quantize_model(model: Transformer, mode: str) -> Transformer:
    """A weight-only quantized copy of `model`.

    The original is left unchanged; unquantized tensors are shared, not copied.

    Every attention and MLP projection and the LM head become `QuantLinear`s; the embedding lookup and
    the norms stay in the model's dtype. A tied LM head gets its own quantized copy of the embedding.
    In a mixture-of-experts layer every routed expert is quantized on its own (`solo.runtime.quant_moe`:
    the experts become a `QuantExperts` stack) and the shared expert like a dense MLP; the router and
    the shared expert's gate stay in the model's dtype.

    Args:
        model: the loaded eager model (float32, bfloat16 or float16).
        mode: "int8" or "int4".

    Returns:
        The quantized copy (a `Transformer` whose `quantization` attribute is `mode`).

    Raises:
        SoloError: an unknown mode, or int4 on a model whose sizes (experts' included) are not multiples
            of 32.
    """
    if mode not in QUANT_MODES:
        raise SoloError(f"unknown quantization {mode!r}; choose one of {', '.join(QUANT_MODES)}")
    dtype = model.dtype
    qmodel = _shallow_tree(model)
    with torch.no_grad():
        for i, layer in enumerate(qmodel.layers):
            attn, mlp = layer.attn, layer.mlp
            attn.q_proj, attn.k_proj, attn.v_proj = _fused_quant(mode, [attn.q_proj, attn.k_proj, attn.v_proj],
                                                                 dtype)
            (attn.o_proj,) = _fused_quant(mode, [attn.o_proj], dtype)
            if model.config.is_moe_layer(i):  # experts one by one, router kept dense (solo.runtime.quant_moe)
                from solo.runtime.quant_moe import quantize_moe_block

                quantize_moe_block(mlp, mode, dtype)
                continue
            mlp.gate_proj, mlp.up_proj = _fused_quant(mode, [mlp.gate_proj, mlp.up_proj], dtype)
            (mlp.down_proj,) = _fused_quant(mode, [mlp.down_proj], dtype)
        head = nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False, device="meta")
        head.weight = nn.Parameter(model.lm_head_weight().detach(), requires_grad=False)
        (qmodel.lm_head,) = _fused_quant(mode, [head], dtype)
    qmodel.quantization = mode
    return qmodel


def set_int8_activations(model: nn.Module, on: bool = True) -> nn.Module:
    """Make every `QuantLinear` of `model` quantize its input to int8 per block of 32 (or stop); returns `model`.

    The eager model then computes what the CPU runtime's integer-dot kernels compute (`CpuRuntime` with
    `int_dot`), so it serves as their reference. In a `Transformer`, the mixture-of-experts blocks' layers
    (experts and shared expert) are left alone: the CPU kernels run them on float activations.
    """
    modules: list[nn.Module] = [model]
    if isinstance(model, Transformer):
        modules = [layer.attn for layer in model.layers]
        modules += [layer.mlp for i, layer in enumerate(model.layers) if not model.config.is_moe_layer(i)]
        modules += [model.lm_head] if model.lm_head is not None else []
    for root in modules:
        for module in root.modules():
            if isinstance(module, QuantLinear):
                module.int8_activations = on
    return model


def model_quantization(model: nn.Module) -> str | None:
    """"int8" / "int4" for a model made by `quantize_model`, else None."""
    return getattr(model, "quantization", None)
