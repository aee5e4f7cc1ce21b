"""Weight-only int8/int4 for mixture-of-experts layers (the MoE part of `solo.runtime.quant.quantize_model`).

Each routed expert's fused gate/up matrix [2 * inter, hidden] and down matrix [hidden, inter] is quantized
on its own, in the formats of `solo.runtime.quant` (int8: a float32 scale per row; int4: a bf16 scale per
32 inputs), and the experts stay stacked: `QuantExperts` holds [experts, rows, ...] integers and scales, so
the CPU kernels find expert e's matrix at a fixed stride. A shared expert (Qwen2-MoE) is quantized like a
dense MLP. The router and the shared expert's sigmoid gate stay in the model's dtype: they are small, and
the top-k choice (and its tie-breaking) should not move with quantization.
"""

from __future__ import annotations

import torch
from torch import nn

from solo.model.moe import SparseMoeBlock
from solo.runtime.quant import QuantLinear, _fused_quant, quantize_int4, quantize_int8


class QuantExperts(nn.Module):
    """A stack of int8 or int4 expert matrices that indexes like the dense [experts, out, in] parameter.

    `experts[e]` (or `experts[ids]`) dequantizes the selected experts only, so `solo.model.moe.experts_forward`
    runs unchanged on a quantized model (eager reference and prefill).

    Args:
        mode: "int8" or "int4".
        qweight: int8 [experts, out, in] or packed uint8 [experts, out, in // 2].
        scale: float32 [experts, out] (int8) or bfloat16 [experts, out, in // 32] (int4).
        in_features: input size.
        dtype: activation dtype of the dequantized weights.
    """

    def __init__(self, mode: str, qweight: torch.Tensor, scale: torch.Tensor, in_features: int,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.mode = mode
        self.in_features = in_features
        self.act_dtype = dtype
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)

    @property
    def shape(self) -> torch.Size:
        """[experts, out, in], the shape of the dense parameter this replaces."""
        return torch.Size((self.qweight.shape[0], self.qweight.shape[1], self.in_features))

    def expert(self, index: int) -> QuantLinear:
        """Expert `index` as a `QuantLinear` over views of the stacked tensors (no copy)."""
        return QuantLinear(self.mode, self.qweight[index], self.scale[index], None, self.in_features, self.act_dtype)

    def __getitem__(self, index: int | torch.Tensor) -> torch.Tensor:
        """Dequantized weights in the activation dtype: [out, in] for an int, [n, out, in] for n expert ids."""
        if isinstance(index, torch.Tensor) and index.dim() > 0:
            return torch.stack([self.expert(int(i)).weight for i in index.tolist()])
        return self.expert(int(index)).weight

    def nbytes(self) -> int:
        """Bytes of the integers and scales of every expert."""
        return self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * self.scale.element_size()


def quantize_experts(weight: torch.Tensor, mode: str, dtype: torch.dtype) -> QuantExperts:
    """Quantize stacked expert matrices [experts, out, in] one expert at a time (bounded memory).

    Raises:
        SoloError: int4 with `in` not a multiple of 32.
    """
    quantize = quantize_int8 if mode == "int8" else quantize_int4
    qs, scales = [], []
    for e in range(weight.shape[0]):
        q, scale = quantize(weight[e])
        qs.append(q)
        scales.append(scale)
    return QuantExperts(mode, torch.stack(qs), torch.stack(scales), weight.shape[2], dtype)


def quantize_moe_block(block: SparseMoeBlock, mode: str, dtype: torch.dtype) -> None:
    """Swap a (shallow-copied) MoE block's experts and shared expert for quantized ones, in place.

    The router and the shared expert's gate are left in the model's dtype (see the module docstring).
    """
    for name in ("gate_up_proj", "down_proj"):
        experts = quantize_experts(getattr(block, name).detach(), mode, dtype)
        del block._parameters[name]  # a Parameter slot cannot take a module
        setattr(block, name, experts)
    shared = block.shared_expert
    if shared is not None:
        shared.gate_proj, shared.up_proj = _fused_quant(mode, [shared.gate_proj, shared.up_proj], dtype)
        (shared.down_proj,) = _fused_quant(mode, [shared.down_proj], dtype)
