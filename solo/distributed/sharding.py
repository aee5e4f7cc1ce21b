"""Splitting a model across tensor-parallel ranks.

Dense models (every architecture of `solo.model.transformer`) shard Megatron-style (Shoeybi et al. 2019,
"Megatron-LM"): q/k/v and gate/up are column-parallel (each rank holds num_heads/N query heads,
num_kv_heads/N KV heads and intermediate_size/N FFN columns; with fewer KV heads than ranks, N a multiple of
them, each rank holds a copy of the one KV head its query heads share, as vLLM replicates them), o_proj and
down_proj row-parallel, followed by one all-reduce per module; the LM head is vocab-parallel (each rank
computes a slice of the logits, then an all-gather). Embeddings and norms are replicated. Lane models put L/N
lanes on each rank (`solo.model.lanes.LaneShard`) and exchange partials through `DistLanes` (DTP).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from solo.distributed.comm import DistLanes, vocab_range
from solo.errors import SoloError
from solo.model.config import ModelConfig
from solo.model.lanes import LaneShard, LaneTransformer, lane_cache_config
from solo.model.transformer import Transformer


def check_tp(config: ModelConfig, world: int) -> None:
    """Refuse a tensor-parallel degree the model cannot be split into.

    Raises:
        SoloError: the heads, KV heads, FFN size (dense) or lanes (lane model) are not multiples of `world`.
    """
    if config.lanes is not None:
        if config.lanes.num_lanes % world:
            raise SoloError(f"--tp {world} does not divide the model's {config.lanes.num_lanes} lanes; use a "
                            "divisor of num_lanes")
        return
    if config.is_moe:
        raise SoloError("--tp does not shard mixture-of-experts layers yet; run this model without --tp")
    if config.qk_norm_full_width:
        raise SoloError("--tp does not shard q/k norms over the whole projection (OLMoE) yet; run this model "
                        "without --tp")
    for name, value in (("num_attention_heads", config.num_heads), ("intermediate_size", config.intermediate_size)):
        if value % world:
            raise SoloError(f"--tp {world} does not divide {name} = {value}; use a divisor of it")
    kv = config.num_kv_heads
    if kv % world and world % kv:
        # Fewer KV heads than ranks: each rank copies the KV head its query heads share, which needs N % kv == 0.
        raise SoloError(f"--tp {world} does not divide num_key_value_heads = {kv}, nor is it a multiple of it "
                        "(then each rank holds a copy of one KV head); use a divisor or a multiple of it")


def kv_heads_of_rank(config: ModelConfig, world: int, rank: int) -> tuple[int, int]:
    """The KV heads [first, first + count) that rank `rank` of `world` holds.

    Its share of num_kv_heads, or, when the model has fewer KV heads than ranks, the one head its query heads
    share (a copy on each of world / num_kv_heads ranks).
    """
    kv = config.num_kv_heads
    if kv >= world:
        return rank * (kv // world), kv // world
    return rank * kv // world, 1


def kv_heads_in_memory(config: ModelConfig, world: int, device_type: str, local_ranks: int | None = None) -> int:
    """KV heads whose cache rank 0's memory holds under `world`-way tensor parallelism, for sizing the KV cache.

    On the CPU the ranks on this host share its memory: every local rank's heads count, a copied KV head once per
    rank that holds it (fewer KV heads than ranks: `kv_heads_of_rank`). On CUDA each rank has its own GPU: rank
    0's heads only.

    Args:
        config: the whole model's config.
        world: tensor-parallel ranks.
        device_type: "cpu" or "cuda".
        local_ranks: ranks on this host, ranks 0 .. local_ranks - 1 (default: all of them, as `solo --tp`
            spawns them; a torchrun job over several hosts passes its LOCAL_WORLD_SIZE).

    Returns:
        A count of KV heads (per layer).
    """
    if device_type == "cuda":
        return kv_heads_of_rank(config, world, 0)[1]
    local = world if local_ranks is None else max(1, min(local_ranks, world))
    return sum(kv_heads_of_rank(config, world, rank)[1] for rank in range(local))


def lane_shard(config: ModelConfig, world: int, rank: int) -> LaneShard:
    """The lanes (and LM-head rows) of rank `rank` of `world`."""
    per = config.lanes.num_lanes // world
    start, stop = vocab_range(config.vocab_size, world, rank)
    return LaneShard(rank * per, (rank + 1) * per, start, stop)


class TPTransformer(nn.Module):
    """One rank's share of a dense model, with the eager `Transformer.forward` contract.

    Args:
        local: a `Transformer` built from the rank's config (heads and FFN divided by the world size) and
            holding its slices; o_proj / down_proj carry no bias (the full bias is added once, after the sum).
        full_config: the whole model's config (`config` of this module, what the engine sees).
        comm: the collectives.
        o_bias, down_bias: per layer, the full o_proj / down_proj bias or None.
    """

    def __init__(self, local: Transformer, full_config: ModelConfig, comm: DistLanes,
                 o_bias: list[torch.Tensor | None], down_bias: list[torch.Tensor | None]) -> None:
        super().__init__()
        self.local = local
        self.config = full_config
        self.cache_config = local.config
        self.comm = comm
        self.o_bias, self.down_bias = o_bias, down_bias

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the weights."""
        return self.local.dtype

    @property
    def device(self) -> torch.device:
        """Device of the weights."""
        return self.local.device

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: object, rows: torch.Tensor,
                last_only: bool = False, kv_len: int | None = None) -> torch.Tensor:
        """As `Transformer.forward`: logits [batch, seq or 1, vocab] in the weights' dtype.

        `cache` holds this rank's KV heads only. Every rank must call it with the same arguments.
        """
        m = self.local
        x = m.embed_tokens(input_ids)
        tables = m.rotary.layer_tables(positions, x.dtype)
        for i, layer in enumerate(m.layers):
            cos, sin = tables[m.config.layer_rope_table(i)]
            h = self.comm.all_reduce(layer.attn(layer.attn_norm(x), cos, sin, positions, cache.k[i], cache.v[i],
                                                rows, kv_len))
            if self.o_bias[i] is not None:
                h = h + self.o_bias[i]
            if layer.sandwich_norm:
                h = layer.attn_out_norm(h)
            x = x + h
            h = self.comm.all_reduce(layer.mlp(layer.mlp_norm(x)))
            if self.down_bias[i] is not None:
                h = h + self.down_bias[i]
            if layer.sandwich_norm:
                h = layer.mlp_out_norm(h)
            x = x + h
        if last_only:
            x = x[:, -1:]
        logits = self.comm.gather_last(F.linear(m.norm(x), m.lm_head.weight))
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


@torch.no_grad()
def shard_dense(full: Transformer, comm: DistLanes) -> TPTransformer:
    """Cut rank `comm.rank`'s slices out of a whole dense model (Megatron-style, see the module docstring).

    Raises:
        SoloError: see `check_tp`.
    """
    cfg, world, rank = full.config, comm.world, comm.rank
    check_tp(cfg, world)
    hd = cfg.head_dim
    q_rows = cfg.num_heads // world * hd
    kv_first, kv_count = kv_heads_of_rank(cfg, world, rank)
    f_rows = cfg.intermediate_size // world
    local_cfg = replace(cfg, num_heads=cfg.num_heads // world, num_kv_heads=kv_count,
                        intermediate_size=f_rows, tie_word_embeddings=False)
    start, stop = vocab_range(cfg.vocab_size, world, rank)
    with torch.device("meta"):
        local = Transformer(local_cfg)

    def put(name: str, tensor: torch.Tensor | None) -> None:
        module_name, _, attr = name.rpartition(".")
        module = local.get_submodule(module_name)
        module._parameters[attr] = None if tensor is None else nn.Parameter(tensor.contiguous().clone(),
                                                                              requires_grad=False)

    # module -> (dim, first row or column, count) of this rank's slice
    kv_slice = (0, kv_first * hd, kv_count * hd)
    cuts = {"attn.q_proj": (0, rank * q_rows, q_rows), "attn.k_proj": kv_slice, "attn.v_proj": kv_slice,
            "attn.o_proj": (1, rank * q_rows, q_rows), "mlp.gate_proj": (0, rank * f_rows, f_rows),
            "mlp.up_proj": (0, rank * f_rows, f_rows), "mlp.down_proj": (1, rank * f_rows, f_rows)}
    for name, param in full.named_parameters():
        parts = name.split(".")
        module = ".".join(parts[2:4]) if name.startswith("layers.") else ""
        if module in cuts:
            dim, first, size = cuts[module]
            if parts[-1] == "bias" and dim == 1:
                put(name, None)  # added once, after the all-reduce
            else:
                put(name, param.narrow(dim if parts[-1] == "weight" else 0, first, size))
        elif name != "lm_head.weight":
            put(name, param)
    o_bias = [layer.attn.o_proj.bias for layer in full.layers]
    down_bias = [layer.mlp.down_proj.bias for layer in full.layers]
    head = full.lm_head_weight()[start:stop]
    local.lm_head = nn.Linear(cfg.hidden_size, stop - start, bias=False, device="meta")
    put("lm_head.weight", head)
    local.rotary = type(full.rotary)(local_cfg).to(full.device)
    return TPTransformer(local.eval().requires_grad_(False), cfg, comm, o_bias, down_bias)


def attach_lane_cache_config(model: LaneTransformer) -> LaneTransformer:
    """Give a lane-model shard the `cache_config` its KV cache is built from (this rank's KV heads)."""
    model.cache_config = lane_cache_config(model.config, model.shard)
    return model
