"""Sparse mixture-of-experts (MoE) MLP block of the eager reference, and its checkpoint names.

A router scores every expert per token, the top-k experts (`torch.topk` order, so ties break as in
`transformers`) run a gated MLP each, and their outputs are summed weighted by the router's probabilities
(Shazeer et al. 2017, "Outrageously Large Neural Networks"; Mixtral: Jiang et al. 2024). Qwen2-MoE adds an
always-on shared expert scaled by a sigmoid gate. Numerics follow transformers 5's default
`grouped_mm` experts path (transformers/integrations/moe.py): each expert's output is multiplied by its
routing weight, then the top-k products are summed in one reduction and cast to the activations' dtype.

Expert weights are stored fused, as transformers 5 holds them in memory: `gate_up_proj` [experts,
2 * moe_intermediate, hidden] (gate rows first) and `down_proj` [experts, hidden, moe_intermediate].
Checkpoints may hold them per expert (Mixtral's w1/w3/w2, Qwen's and OLMoE's gate/up/down_proj) or fused;
`moe_tensor_target` maps either onto the fused parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from solo.model.config import ModelConfig
from solo.model.layers import _ACTIVATIONS, MLP


def route(
    hidden: torch.Tensor, router_weight: torch.Tensor, top_k: int, norm_topk_prob: bool, weights_fp32: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick each token's experts.

    Args:
        hidden: [tokens, hidden] activations (the weights' dtype).
        router_weight: [experts, hidden] router matrix.
        top_k: experts per token.
        norm_topk_prob: renormalize the top-k probabilities to sum to 1.
        weights_fp32: return the routing weights in float32 (Mixtral) instead of the hidden dtype.

    Returns:
        (weights [tokens, top_k], expert ids int64 [tokens, top_k]), in `torch.topk` order: descending
        probability, ties broken as torch.topk breaks them (the same call transformers makes).
    """
    logits = F.linear(hidden, router_weight)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top_p, top_ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        top_p = top_p / top_p.sum(dim=-1, keepdim=True)
    if not weights_fp32:
        top_p = top_p.to(logits.dtype)
    return top_p, top_ids


def experts_forward(
    hidden: torch.Tensor,
    expert_ids: torch.Tensor,
    routing_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    act=F.silu,
) -> torch.Tensor:
    """Run each token through its selected experts and sum their weighted outputs.

    Only the selected experts' weights are read: tokens are grouped by expert, and each expert hit runs
    one gated MLP over its tokens (a GEMV per expert at batch 1). The expert ids are read on the host,
    except for a few tokens on a GPU, where the selected experts are gathered on the device instead.

    Args:
        hidden: [tokens, hidden] activations.
        expert_ids: int64 [tokens, top_k] from `route`.
        routing_weights: [tokens, top_k] from `route`.
        gate_up_proj: [experts, 2 * inter, hidden], gate rows first.
        down_proj: [experts, hidden, inter].
        act: the gate activation.

    Returns:
        [tokens, hidden] in hidden's dtype.
    """
    tokens, top_k = expert_ids.shape
    inter = down_proj.shape[-1]
    if hidden.device.type != "cpu" and tokens * top_k <= _GATHER_PAIRS:
        return _gathered_experts(hidden, expert_ids, routing_weights, gate_up_proj, down_proj, act)
    out = hidden.new_empty(tokens * top_k, hidden.shape[-1])
    if tokens == 1:
        # Batch-1 decode: each expert serves one pair; skip the grouping (same products, fewer ops).
        for slot, expert in enumerate(expert_ids[0].tolist()):
            gate_up = F.linear(hidden, gate_up_proj[expert])
            out[slot:slot + 1] = F.linear(act(gate_up[:, :inter]) * gate_up[:, inter:], down_proj[expert])
    else:
        flat = expert_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
        start = 0
        for expert, count in zip(experts.tolist(), counts.tolist(), strict=True):
            pairs = order[start:start + count]
            start += count
            gate_up = F.linear(hidden[pairs // top_k], gate_up_proj[expert])
            out[pairs] = F.linear(act(gate_up[:, :inter]) * gate_up[:, inter:], down_proj[expert])
    weighted = out.view(tokens, top_k, -1) * routing_weights.unsqueeze(-1)
    return weighted.sum(dim=1).to(hidden.dtype)


_GATHER_PAIRS = 64  # token-expert pairs up to which a GPU gathers the experts instead of grouping on the host


def _gathered_experts(
    hidden: torch.Tensor, expert_ids: torch.Tensor, routing_weights: torch.Tensor, gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor, act,
) -> torch.Tensor:
    # Decode on a GPU: index the selected experts on the device (no host sync, so CUDA graphs can capture
    # it and torch.compile sees static shapes), at the cost of copying their weights once.
    tokens, top_k = expert_ids.shape
    inter = down_proj.shape[-1]
    flat = expert_ids.reshape(-1)
    x = hidden.repeat_interleave(top_k, dim=0).unsqueeze(-1)
    gate_up = torch.bmm(gate_up_proj[flat], x).squeeze(-1)
    h = (act(gate_up[:, :inter]) * gate_up[:, inter:]).unsqueeze(-1)
    out = torch.bmm(down_proj[flat], h).squeeze(-1)
    weighted = out.view(tokens, top_k, -1) * routing_weights.unsqueeze(-1)
    return weighted.sum(dim=1).to(hidden.dtype)


class SparseMoeBlock(nn.Module):
    """The MoE MLP of one layer: router, routed experts, optional shared expert with a sigmoid gate.

    Args:
        config: model config (`num_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
            `shared_expert_intermediate_size`, `norm_topk_prob`, `router_weights_fp32`).

    Weights:
        router.weight [experts, hidden]; gate_up_proj [experts, 2 * inter, hidden]; down_proj
        [experts, hidden, inter]; with a shared expert also shared_expert.{gate,up,down}_proj.weight and
        shared_expert_gate.weight [1, hidden].
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, inter, experts = config.hidden_size, config.moe_intermediate_size, config.num_experts
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.weights_fp32 = config.router_weights_fp32
        self.act = _ACTIVATIONS[config.hidden_act]
        self.router = nn.Linear(h, experts, bias=False)
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * inter, h))
        self.down_proj = nn.Parameter(torch.empty(experts, h, inter))
        self.shared_expert = None
        if config.shared_expert_intermediate_size:
            self.shared_expert = MLP(config, intermediate_size=config.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(h, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, hidden] -> [batch, seq, hidden], in the weights' dtype."""
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = route(flat, self.router.weight, self.top_k, self.norm_topk_prob, self.weights_fp32)
        out = experts_forward(flat, ids, weights, self.gate_up_proj, self.down_proj, self.act)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.view(x.shape)


@dataclass(frozen=True)
class MoeTensorTarget:
    """Where a checkpoint tensor of an MoE layer goes.

    Attributes:
        name: the eager model's parameter name.
        expert: the expert index for a per-expert tensor, None for a whole tensor.
        part: for a per-expert tensor, "gate", "up" or "down" (its slice of the fused parameter).
    """

    name: str
    expert: int | None = None
    part: str | None = None


_MOE_RE = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.(.+)$")
_PER_EXPERT_RE = re.compile(r"^experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
_PARTS = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
_WHOLE = {
    "gate.weight": "router.weight",
    "experts.gate_up_proj": "gate_up_proj",
    "experts.down_proj": "down_proj",
    "shared_expert_gate.weight": "shared_expert_gate.weight",
    "shared_expert.gate_proj.weight": "shared_expert.gate_proj.weight",
    "shared_expert.up_proj.weight": "shared_expert.up_proj.weight",
    "shared_expert.down_proj.weight": "shared_expert.down_proj.weight",
}


def moe_tensor_target(hf_name: str, config: ModelConfig) -> MoeTensorTarget | None:
    """Map a Hugging Face tensor of an MoE layer onto the eager model, or None when it is no MoE tensor.

    Covers Mixtral's `block_sparse_moe.{gate, experts.N.w1/w2/w3}`, Qwen-MoE's and OLMoE's
    `mlp.{gate, experts.N.{gate,up,down}_proj, shared_expert.*, shared_expert_gate}` and transformers 5's
    fused `mlp.experts.{gate_up_proj, down_proj}`. Dense layers of an MoE model (Qwen's mlp_only_layers)
    use the ordinary MLP names and return None here.
    """
    match = _MOE_RE.match(hf_name)
    if match is None or not config.is_moe_layer(int(match.group(1))):
        return None
    layer, rest = match.groups()
    prefix = f"layers.{layer}.mlp."
    if rest in _WHOLE:
        return MoeTensorTarget(prefix + _WHOLE[rest])
    per_expert = _PER_EXPERT_RE.match(rest)
    if per_expert is None:
        return None
    expert, kind = per_expert.groups()
    part = _PARTS[kind]
    return MoeTensorTarget(prefix + ("down_proj" if part == "down" else "gate_up_proj"), int(expert), part)


def expert_slice(param: torch.Tensor, target: MoeTensorTarget) -> torch.Tensor:
    """The view of a fused expert parameter that a per-expert tensor fills (see `MoeTensorTarget`)."""
    if target.part == "down":
        return param[target.expert]
    inter = param.shape[1] // 2
    return param[target.expert, :inter] if target.part == "gate" else param[target.expert, inter:]
