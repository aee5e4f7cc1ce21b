"""Fused weight layout for the decode kernels, sharing storage with the eager model.

The QKV kernel reads q, k and v rows from one matrix, and the gated-MLP kernel reads gate and up rows
from one matrix. Each pair of matrices is concatenated once, and the eager model's parameters are then
replaced by views into the fused tensors, so the weights are held once and the eager model (prefill,
batched decode, the oracle) computes exactly what it did before.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import nn

from solo.model.transformer import Transformer


@dataclass
class FusedLayer:
    """One decoder layer's tensors in kernel layout.

    Attributes:
        w_qkv: [(H_q + 2 H_kv) * D, hidden], rows q | k | v; b_qkv: matching bias or None.
        w_o, b_o: output projection [hidden, H_q * D] and bias.
        w_gate_up: [2F, hidden], rows gate | up; b_gate_up: matching bias or None.
        w_down, b_down: down projection [hidden, F] and bias.
        In a mixture-of-experts layer w_gate_up and w_down are None: its experts are already fused
        ([experts, 2F, hidden] and [experts, hidden, F] on `layer.mlp`, see `solo.model.moe`).
    """

    w_qkv: torch.Tensor
    b_qkv: torch.Tensor | None
    w_o: torch.Tensor
    b_o: torch.Tensor | None
    w_gate_up: torch.Tensor | None
    b_gate_up: torch.Tensor | None
    w_down: torch.Tensor | None
    b_down: torch.Tensor | None


_FUSED: weakref.WeakKeyDictionary[Transformer, list[FusedLayer]] = weakref.WeakKeyDictionary()


def _fuse(modules: list[nn.Linear], attr: str) -> torch.Tensor | None:
    """Concatenate `attr` of the modules along dim 0 and point each module at its slice of the result."""
    tensors = [getattr(m, attr) for m in modules]
    if tensors[0] is None:
        return None
    fused = torch.cat([t.detach() for t in tensors], dim=0).contiguous()
    start = 0
    for module, tensor in zip(modules, tensors, strict=True):
        rows = tensor.shape[0]
        module._parameters[attr] = nn.Parameter(fused[start:start + rows], requires_grad=False)
        start += rows
    return fused


def fused_layers(model: Transformer) -> list[FusedLayer]:
    """The model's layers in kernel layout (built once per model; the eager parameters become views).

    Returns:
        One `FusedLayer` per decoder layer.
    """
    cached = _FUSED.get(model)
    if cached is not None:
        return cached
    layers = []
    with torch.no_grad():
        for layer in model.layers:
            attn, mlp = layer.attn, layer.mlp
            qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
            if isinstance(mlp.down_proj, nn.Linear):
                gate_up = [mlp.gate_proj, mlp.up_proj]
                mlp_tensors = dict(w_gate_up=_fuse(gate_up, "weight"), b_gate_up=_fuse(gate_up, "bias"),
                                   w_down=mlp.down_proj.weight, b_down=mlp.down_proj.bias)
            else:  # a sparse MoE block: experts already fused
                mlp_tensors = dict(w_gate_up=None, b_gate_up=None, w_down=None, b_down=None)
            layers.append(FusedLayer(
                w_qkv=_fuse(qkv, "weight"), b_qkv=_fuse(qkv, "bias"),
                w_o=attn.o_proj.weight, b_o=attn.o_proj.bias, **mlp_tensors,
            ))
    _FUSED[model] = layers
    return layers


def weight_bytes_per_token(model: Transformer) -> int:
    """Bytes of weights one batch-1 decode step reads: every parameter once, one embedding row.

    The LM head is counted even when tied (it is read in full for the logits); the embedding table is
    not (one row per token). Of a mixture-of-experts layer's experts, only the top-k are read.
    """
    total = 0
    cfg = model.config
    for name, p in model.named_parameters():
        if name == "embed.weight":
            total += p.shape[1] * p.element_size()
        elif name.endswith(("mlp.gate_up_proj", "mlp.down_proj")) and p.dim() == 3:
            total += p[0].numel() * p.element_size() * cfg.num_experts_per_tok
        else:
            total += p.numel() * p.element_size()
    if model.lm_head is None:
        total += model.embed.weight.numel() * model.embed.weight.element_size()
    return total
