"""Lane models (Laneformer) in eager PyTorch: lane linears, per-lane residuals, Delayed Tensor Parallelism.

Spec: ../shared/laneformer.md (Kog's Laneformer 2B and its "Delayed Tensor Parallelism" posts). A lane model
has L lanes; each keeps its own full-width residual stream `[batch, seq, L, hidden]` and owns 1/L of every
block (query heads `l*Hq/L ...`, KV heads `l*Hkv/L ...`, FFN columns), Megatron-style. Each module (attention,
MLP) of layer i gives one full-width *partial* per lane; lane l adds its own partial at once and the other
lanes' partials of layer i - d (DTP, delay d) -- section 4 of the spec:

- layer i >= d: `h_l += own_l(i) + sum_{j != l} partial_j(i - d)` when layer i - d broadcast that module
  (computed as `sum_j partial_j(i-d) - partial_l(i-d)`), else `h_l += own_l(i)`;
- layer i < d: `h_l += sum_j partial_j(i)` (use_early_comm) or `h_l += sqrt(L) * own_l(i)` (without);
- d = 0: every layer is all-reduced at once (`h_l += sum_j partial_j(i)`), i.e. standard tensor parallelism.

The same module runs all lanes in one process (lanes are a batch dimension, the delayed sums a ring of the
last d layers' partials) or a contiguous range of lanes per rank under `torch.distributed`: the cross-lane
sums then go through a `LaneComm` (solo.distributed), started when a partial is made and waited d layers
later. KV cache: `solo.model.transformer.KVCache`, whose kv heads are lane-major, so lane l's heads are a
contiguous block.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from solo.model.config import LaneConfig, ModelConfig
from solo.model.layers import RMSNorm, attention_mask
from solo.model.rope import rope_inv_freq


class Pending:
    """A cross-lane sum in flight: `wait()` returns it, `[batch, seq, 1, hidden]`."""

    def __init__(self, value: torch.Tensor, wait: Callable[[], None] | None = None) -> None:
        self._value = value
        self._wait = wait

    def wait(self) -> torch.Tensor:
        """Block until the sum is complete; returns it (same dtype as the partials)."""
        if self._wait is not None:
            self._wait()
            self._wait = None
        return self._value


class LocalLanes:
    """Cross-lane communication when every lane lives in this process (no communication at all).

    The TP counterpart (`solo.distributed.comm.DistLanes`) has the same methods and sums over ranks too.
    """

    def lane_sum(self, x: torch.Tensor) -> Pending:
        """Start `sum over lanes` of x `[batch, seq, lanes, hidden]`; returns a `Pending` [batch, seq, 1, hidden]."""
        return Pending(x.sum(dim=2, keepdim=True))

    def lane_sum_now(self, x: torch.Tensor) -> torch.Tensor:
        """Blocking sum over lanes: [batch, seq, lanes, n] -> [batch, seq, 1, n]."""
        return x.sum(dim=2, keepdim=True)

    def gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate the last dim over ranks (one process: x itself)."""
        return x


@dataclass(frozen=True)
class LaneShard:
    """Which lanes (and which vocabulary rows of a vocab-parallel head) this process holds.

    Attributes:
        lane_start, lane_stop: the contiguous lane range [start, stop).
        vocab_start, vocab_stop: LM-head rows computed here for "replicate" / "pre_norm_lane_agg" (the
            logits are then gathered over ranks; one process: the whole vocabulary).
    """

    lane_start: int
    lane_stop: int
    vocab_start: int
    vocab_stop: int

    @classmethod
    def whole(cls, config: ModelConfig) -> LaneShard:
        """All lanes and the whole vocabulary (one process)."""
        return cls(0, config.lanes.num_lanes, 0, config.vocab_size)

    @property
    def num_lanes(self) -> int:
        """Lanes held here."""
        return self.lane_stop - self.lane_start


class LaneLinear(nn.Module):
    """L independent linear maps, one per lane: `einsum("bsli,loi->bslo")`.

    "row" lane linears (wq, wk, wv, w1, w3) have weight `[L, out/L, in]`: lane l maps its own residual
    `[.., in]` to its slice of the outputs. "column" ones (wo, w2) have weight `[L, out, in/L]`: lane l maps
    its slice back to a full-width partial. No bias (Laneformer has none).

    Args:
        lanes: lanes held here.
        in_per_lane: input features per lane (in, or in/L).
        out_per_lane: output features per lane (out/L, or out).
    """

    def __init__(self, lanes: int, in_per_lane: int, out_per_lane: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(lanes, out_per_lane, in_per_lane))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, lanes, in_per_lane] -> [batch, seq, lanes, out_per_lane] in the weights' dtype."""
        # On the CPU a half-precision batched matmul (einsum -> bmm) is several times slower than one F.linear
        # per lane; in float32 (training) the batched product is the faster one.
        w = self.weight
        if w.dtype == torch.float32 or w.device.type != "cpu":
            return torch.einsum("bsli,loi->bslo", x, w)
        if w.shape[0] == 1:
            return F.linear(x[:, :, 0], w[0]).unsqueeze(2)
        return torch.stack([F.linear(x[:, :, lane], w[lane]) for lane in range(w.shape[0])], dim=2)


def interleaved_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs `(x[2i], x[2i+1])` by angle `pos * inv_freq[i]` (Meta's complex-number RoPE).

    Source: Su et al. 2021 ("RoFormer"), in the interleaved form of Meta's Llama reference
    (`apply_rotary_emb` with `torch.view_as_complex`), which the Laneformer code keeps; computed in float32.

    Args:
        x: [batch, seq, heads, head_dim].
        cos, sin: float32 [batch, seq, head_dim // 2].

    Returns:
        [batch, seq, heads, head_dim] in x's dtype.
    """
    pairs = x.float().unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[:, :, None], sin[:, :, None]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)


class LaneAttention(nn.Module):
    """Per-lane attention: lane l projects its own normed residual to its own heads, output a full-width partial.

    Args:
        config: model config (with `lanes`).
        layer_idx: the layer (selects its sliding window).
        lanes: lanes held here.
    """

    def __init__(self, config: ModelConfig, layer_idx: int, lanes: int) -> None:
        super().__init__()
        num_lanes = config.lanes.num_lanes
        d, hd = config.hidden_size, config.head_dim
        self.config = config
        self.lanes = lanes
        self.heads = config.num_heads // num_lanes * lanes  # query heads held here
        self.kv_heads = config.num_kv_heads // num_lanes * lanes
        self.window = config.layer_sliding_windows[layer_idx]
        self.wq = LaneLinear(lanes, d, config.num_heads // num_lanes * hd)
        self.wk = LaneLinear(lanes, d, config.num_kv_heads // num_lanes * hd)
        self.wv = LaneLinear(lanes, d, config.num_kv_heads // num_lanes * hd)
        self.wo = LaneLinear(lanes, config.num_heads // num_lanes * hd, d)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        k_cache: torch.Tensor | None,
        v_cache: torch.Tensor | None,
        rows: torch.Tensor | None,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """Normed residuals [batch, seq, lanes, hidden] -> partials [batch, seq, lanes, hidden].

        With a cache (`k_cache`/`v_cache` [cache_rows, kv_heads held here, max_seq, head_dim]) this step's keys
        and values are written at (rows[b], :, positions[b, s]) and attention runs over the cache, as
        `solo.model.layers.Attention`; without one (training) it is causal over `x` itself.
        """
        cfg = self.config
        batch, seq = x.shape[:2]
        hd = cfg.head_dim
        q = interleaved_rope(self.wq(x).reshape(batch, seq, self.heads, hd), cos, sin).transpose(1, 2)
        k = interleaved_rope(self.wk(x).reshape(batch, seq, self.kv_heads, hd), cos, sin)
        v = self.wv(x).reshape(batch, seq, self.kv_heads, hd)
        if k_cache is None:
            keys, values = k.transpose(1, 2), v.transpose(1, 2)
            mask = attention_mask(positions - positions[:, :1], seq, self.window)  # keys are x's own tokens
        else:
            row_idx = rows[:, None].expand(batch, seq)
            k_cache[row_idx, :, positions] = k.to(k_cache.dtype)
            v_cache[row_idx, :, positions] = v.to(v_cache.dtype)
            if kv_len is None:
                kv_len = int(positions.max()) + 1
            keys, values = k_cache[rows, :, :kv_len], v_cache[rows, :, :kv_len]
            mask = attention_mask(positions, kv_len, self.window)
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=cfg.attn_scale, enable_gqa=self.heads != self.kv_heads
        )
        return self.wo(out.transpose(1, 2).reshape(batch, seq, self.lanes, -1))


class LaneMLP(nn.Module):
    """Per-lane SwiGLU: `w2_l(silu(w1_l x_l) * w3_l x_l)`, each lane owning intermediate_size / L columns.

    Args:
        config: model config (with `lanes`).
        lanes: lanes held here.
    """

    def __init__(self, config: ModelConfig, lanes: int) -> None:
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size // config.lanes.num_lanes
        self.w1 = LaneLinear(lanes, d, f)
        self.w3 = LaneLinear(lanes, d, f)
        self.w2 = LaneLinear(lanes, f, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normed residuals [batch, seq, lanes, hidden] -> partials [batch, seq, lanes, hidden]."""
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LaneLayer(nn.Module):
    """One layer's modules, under the Laneformer names (attention, feed_forward, attention_norm, ffn_norm).

    The residual update is the model's (it needs the partials of earlier layers), see `LaneTransformer`.
    """

    def __init__(self, config: ModelConfig, layer_idx: int, lanes: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = LaneAttention(config, layer_idx, lanes)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feed_forward = LaneMLP(config, lanes)


class LaneRotary(nn.Module):
    """Interleaved RoPE tables: float32 cos/sin [batch, seq, head_dim // 2] for int64 positions [batch, seq]."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(config.rope, config.head_dim), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) for each position, float32 [batch, seq, head_dim // 2]."""
        freqs = positions.float()[:, :, None] * self.inv_freq.float()[None, None, :]
        return freqs.cos(), freqs.sin()


class LaneTransformer(nn.Module):
    """A lane model (Laneformer) with the eager `Transformer`'s interface (same forward, same `KVCache`).

    Parameter names follow the Laneformer checkpoint minus its `model.` prefix (`tok_embeddings`,
    `layers.{i}.attention.wq`, ..., `norm`, `lm_head`), so `solo.model.weights` maps them one to one.

    Args:
        config: model config with `lanes` set.
        shard: the lanes held here (default: all of them, one process).
        comm: cross-lane communication (default: `LocalLanes`; `solo.distributed` passes its own).

    Raises:
        ValueError: `config.lanes` is None.
    """

    def __init__(self, config: ModelConfig, shard: LaneShard | None = None, comm: LocalLanes | None = None) -> None:
        super().__init__()
        if config.lanes is None:
            raise ValueError("LaneTransformer needs a config with lanes (a Laneformer config.json)")
        self.config = config
        self.lane_config: LaneConfig = config.lanes
        self.shard = shard or LaneShard.whole(config)
        self.comm = comm or LocalLanes()
        lanes, d, v = self.shard.num_lanes, config.hidden_size, config.vocab_size
        self.tok_embeddings = nn.Embedding(v, d)
        self.layers = nn.ModuleList(LaneLayer(config, i, lanes) for i in range(config.num_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
        head = self.lane_config.lm_head_type
        if head == "lane":
            self.lm_head = nn.Linear(lanes * d, v, bias=False)
        elif head == "vocab_parallel":
            self.lm_head = None if config.tie_word_embeddings else nn.Linear(d, v // self.lane_config.num_lanes * lanes,
                                                                             bias=False)
        else:
            rows = self.shard.vocab_stop - self.shard.vocab_start
            self.lm_head = None if config.tie_word_embeddings else nn.Linear(d, rows, bias=False)
        self.rotary = LaneRotary(config)

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the weights."""
        return self.tok_embeddings.weight.dtype

    @property
    def device(self) -> torch.device:
        """Device of the weights."""
        return self.tok_embeddings.weight.device

    def lm_head_weight(self) -> torch.Tensor:
        """The LM-head rows held here: [vocab rows, hidden], or [vocab, lanes held * hidden] for "lane"."""
        if self.lm_head is not None:
            return self.lm_head.weight
        if self.lane_config.lm_head_type == "vocab_parallel":
            per_lane = self.config.vocab_size // self.lane_config.num_lanes
            return self.tok_embeddings.weight[self.shard.lane_start * per_lane:self.shard.lane_stop * per_lane]
        return self.tok_embeddings.weight[self.shard.vocab_start:self.shard.vocab_stop]

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """int64 [batch, seq] -> [batch, seq, lanes held, hidden]: the embedding copied into every lane."""
        x = self.tok_embeddings(input_ids)
        return x[:, :, None, :].expand(-1, -1, self.shard.num_lanes, -1).contiguous()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final aggregation of the lanes (`lm_head_type`, spec section 4).

        Maps [batch, seq, lanes, hidden] to [batch, seq, vocab] logits in the weights' dtype.

        replicate: final norm per lane, mean over lanes, one [vocab, hidden] head; pre_norm_lane_agg: sum
        of the lanes, final norm, head; lane: per-lane final norm, lanes concatenated, [vocab, L*hidden]
        head; vocab_parallel: lane l's normed stream gives logits for vocabulary slice l.
        """
        head, w = self.lane_config.lm_head_type, self.lm_head_weight()
        num_lanes = self.lane_config.num_lanes
        if head == "replicate":
            agg = self.comm.lane_sum_now(self.norm(h)) / num_lanes
            return self.comm.gather_last(F.linear(agg[:, :, 0], w))
        if head == "pre_norm_lane_agg":
            agg = self.norm(self.comm.lane_sum_now(h))
            return self.comm.gather_last(F.linear(agg[:, :, 0], w))
        normed = self.norm(h)
        if head == "lane":
            partial = F.linear(normed.flatten(2), w)  # this process's lanes' share of the logits
            return self.comm.lane_sum_now(partial[:, :, None])[:, :, 0]
        # vocab_parallel
        per_lane = w.view(self.shard.num_lanes, -1, w.shape[-1])
        local = torch.einsum("bsld,lvd->bslv", normed, per_lane).flatten(2)
        return self.comm.gather_last(local)

    def _update(self, ring: dict, kind: int, i: int, partial: torch.Tensor) -> torch.Tensor:
        # The residual update of spec section 4 for module `kind` (0 attention, 1 MLP) of layer i.
        lc = self.lane_config
        d, n = lc.broadcast_delay, self.config.num_layers
        flags = lc.broadcast_attention_to_future if kind == 0 else lc.broadcast_mlp_to_future
        if d == 0:
            if flags[i]:
                return self.comm.lane_sum(partial).wait()
            return partial
        if flags[i] and i + d < n:
            ring[kind, i] = (partial, self.comm.lane_sum(partial))  # waited d layers later
        if i < d:
            if lc.use_early_comm:
                return self.comm.lane_sum_now(partial)
            return partial * math.sqrt(lc.num_lanes)
        j = i - d
        if flags[j]:
            old, pending = ring.pop((kind, j))
            return partial + (pending.wait() - old)
        return partial

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: object | None = None,
        rows: torch.Tensor | None = None,
        last_only: bool = False,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """Run the lane model over new tokens (the eager `Transformer.forward` contract).

        Args:
            input_ids: int64 [batch, seq].
            positions: int64 [batch, seq] absolute positions.
            cache: a `KVCache` built for this process's kv heads, or None (causal over the input, training).
            rows: int64 [batch] cache rows (with a cache).
            last_only: logits of the last position only.
            kv_len: cache slots attended over, or None (read from positions).

        Returns:
            Logits [batch, seq, vocab] (or [batch, 1, vocab]) in the weights' dtype.
        """
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions)
        ring: dict = {}
        for i, layer in enumerate(self.layers):
            k_cache = None if cache is None else cache.k[i]
            v_cache = None if cache is None else cache.v[i]
            a = layer.attention(layer.attention_norm(h), cos, sin, positions, k_cache, v_cache, rows, kv_len)
            h = h + self._update(ring, 0, i, a)
            m = layer.feed_forward(layer.ffn_norm(h))
            h = h + self._update(ring, 1, i, m)
        if last_only:
            h = h[:, -1:]
        return self.logits(h)


def lane_cache_config(config: ModelConfig, shard: LaneShard) -> ModelConfig:
    """The config a `KVCache` for `shard`'s lanes is built from (only its kv heads)."""
    from dataclasses import replace

    kv = config.num_kv_heads // config.lanes.num_lanes * shard.num_lanes
    return replace(config, num_kv_heads=kv, num_heads=config.num_heads // config.lanes.num_lanes * shard.num_lanes)


@torch.no_grad()
def build_random_lane_model(config: ModelConfig, dtype: torch.dtype, seed: int = 0, std: float = 0.02,
                            device: torch.device | str = "cpu") -> LaneTransformer:
    """A one-process `LaneTransformer` with random weights (matrices N(0, std^2), norm scales 1).

    The same seed gives the same weights, whatever the device count later used to shard them.
    """
    with torch.device("meta"):
        model = LaneTransformer(config)
    model = model.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, std, generator=gen)
    model.rotary = LaneRotary(config).to(device)
    return model.eval().requires_grad_(False)


def laneformer_state_dict(model: LaneTransformer) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of a one-process lane model, under the Laneformer names (lane layout kept)."""
    out = {}
    for name, tensor in model.state_dict().items():
        out[name if name.startswith("lm_head.") else "model." + name] = tensor.contiguous()
    return out
