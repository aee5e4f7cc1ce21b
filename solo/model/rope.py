"""Rotary position embeddings (RoPE) with the scaling schemes Hugging Face checkpoints use.

Source: Su et al., "RoFormer" (2021) for RoPE; the scaling formulas follow transformers'
`modeling_rope_utils.py` (linear interpolation, dynamic NTK, Llama 3.1 bands, LongRoPE, YaRN). Frequencies use the
"rotate half" layout of the Hugging Face Llama family (first half / second half of each head).
"""

from __future__ import annotations

import math

import torch

from solo.model.config import ModelConfig, RopeConfig


def rope_inv_freq(rope: RopeConfig, head_dim: int, device: torch.device | str | None = None,
                  rotary_dim: int | None = None) -> torch.Tensor:
    """Inverse frequencies for a static RoPE type (default, linear, llama3, longrope, yarn; dynamic at its base length).

    default: theta ** (-2i / head_dim) (Su et al. 2021, "RoFormer"); linear: divided by `factor`
    (position interpolation, Chen et al. 2023); llama3: Meta's Llama 3.1 frequency bands, as
    transformers' `_compute_llama3_parameters`; longrope: divided per frequency by `short_factor` or
    `long_factor` (`rope.use_long_factor`; Ding et al. 2024, "LongRoPE"), as `_compute_longrope_parameters`;
    yarn: YaRN's blend of kept and interpolated frequencies (Peng et al. 2023), as `_compute_yarn_parameters`.

    Args:
        rope: RoPE parameters.
        head_dim: features per attention head (even).
        device: where to build the tensor.
        rotary_dim: dims RoPE rotates (`ModelConfig.rope_dim`; default head_dim): the frequencies are those of
            a rotary_dim head, followed by zeros (unrotated dims: cos 1, sin 0) up to head_dim // 2.

    Returns:
        float32 tensor [head_dim // 2], in radians per position.
    """
    dim = rotary_dim or head_dim
    exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    if rope.rope_type == "longrope":
        factors = rope.long_factor if rope.use_long_factor else rope.short_factor
        inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32, device=device) * rope.theta**exponent)
    else:
        inv_freq = 1.0 / (rope.theta**exponent)
        if rope.rope_type == "linear":
            inv_freq = inv_freq / rope.factor
        elif rope.rope_type == "llama3":
            inv_freq = _llama3_scale(inv_freq, rope)
        elif rope.rope_type == "yarn":
            inv_freq = _yarn_scale(rope, dim, device)
    if dim < head_dim:
        inv_freq = torch.cat((inv_freq, inv_freq.new_zeros((head_dim - dim) // 2)))
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between interpolated.
    # Same formula as transformers' `_compute_llama3_parameters` (Meta's Llama 3.1 reference).
    old_len = rope.original_max_position_embeddings or 8192
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_scale(rope: RopeConfig, dim: int, device: torch.device | str | None) -> torch.Tensor:
    # YaRN (Peng et al. 2023): frequencies that turn more than beta_fast times over the original context are
    # kept, those turning fewer than beta_slow times are divided by `factor`, and a linear ramp over the dims
    # between blends the two. Same float32 steps as transformers' `_compute_yarn_parameters`.
    original = rope.original_max_position_embeddings or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of width 0 would divide by zero
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    return (1.0 / (rope.factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


def dynamic_ntk_inv_freq(config: ModelConfig, seq_len: torch.Tensor) -> torch.Tensor:
    """Dynamic NTK-scaled inverse frequencies for sequences of `seq_len` tokens.

    Below `max_position_embeddings` this equals the default frequencies. As in transformers'
    `_compute_dynamic_ntk_parameters` (the "dynamic NTK-aware" scaling first posted by bloc97/emozilla,
    2023), the base grows with the current length:
    base * ((factor * len / max_pos) - (factor - 1)) ** (dim / (dim - 2)). Unlike transformers, which
    uses the longest row of the batch, each row gets the frequencies of its own length.

    Args:
        config: model config with `rope.rope_type == "dynamic"`.
        seq_len: int64 tensor [batch], the current length of each row (largest position + 1).

    Returns:
        float32 tensor [batch, head_dim // 2].
    """
    dim = config.head_dim
    max_pos = config.max_position_embeddings
    seq_len = torch.clamp(seq_len, min=max_pos)
    factor = config.rope.factor
    # float32 tensor arithmetic, as transformers does it, so frequencies match bit for bit.
    base = config.rope.theta * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=seq_len.device).float() / dim
    return 1.0 / (base[:, None] ** exponent[None, :])


class RotaryEmbedding(torch.nn.Module):
    """Computes RoPE cos/sin tables for given positions (Su et al. 2021, "RoFormer").

    A model whose layers differ (`ModelConfig.layer_ropes`: Gemma 3's local and global layers, SmolLM3's NoPE
    layers) has one table per entry of `config.rope_tables`; `forward(..., table=t)` gives table t, and a NoPE
    table is the identity (cos 1, sin 0: `apply_rope` then returns its input exactly). With partial rotary
    embeddings (`ModelConfig.rope_dim` < head_dim) the entries past rope_dim / 2 of each half are that identity
    (the projections' rows are reordered to match at load: see `ModelConfig.rope_dim`).

    Args:
        config: model config (head_dim and rope parameters).

    Attributes:
        inv_freq: float32 buffer [head_dim // 2], table 0's static frequencies (dynamic NTK recomputes per call).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tables = config.rope_tables
        self.register_buffer("inv_freq", rope_inv_freq(config.rope, config.head_dim, rotary_dim=config.rope_dim),
                             persistent=False)
        for t, rope in enumerate(self.tables[1:], start=1):
            if rope is not None:
                self.register_buffer(f"inv_freq_{t}", rope_inv_freq(rope, config.head_dim, rotary_dim=config.rope_dim),
                                     persistent=False)

    def table_inv_freq(self, table: int) -> torch.Tensor | None:
        """Static inverse frequencies [head_dim // 2] (float32) of `table`, None for a NoPE table."""
        if self.tables[table] is None:
            return None
        return self.inv_freq if table == 0 else getattr(self, f"inv_freq_{table}")

    def forward(self, positions: torch.Tensor, dtype: torch.dtype, table: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos and sin for each position.

        Args:
            positions: int64 [batch, seq], absolute token positions.
            dtype: dtype of the returned tables (the activations' dtype).
            table: which of `config.rope_tables` (0: `config.rope`).

        Returns:
            (cos, sin), each [batch, seq, head_dim] in `dtype`, computed in float32 first (and multiplied by
            LongRoPE's `attention_factor` there); the two halves of head_dim repeat the same [head_dim // 2]
            angles ("rotate half" layout). A NoPE table gives ones and zeros.
        """
        rope = self.tables[table]
        if rope is None:
            shape = (*positions.shape, self.config.head_dim)
            return (torch.ones(shape, dtype=dtype, device=positions.device),
                    torch.zeros(shape, dtype=dtype, device=positions.device))
        if rope.rope_type == "dynamic":
            # A prompt's tokens (from position 0) take the whole prompt's length, as transformers rotates a prompt;
            # tokens after cached ones (a speculative verify) each their own, as one-token decode steps do.
            whole = positions.max(dim=1, keepdim=True).values + 1  # [batch, 1]
            lengths = torch.where(positions[:, :1] > 0, positions + 1, whole)  # [batch, seq]
            inv_freq = dynamic_ntk_inv_freq(self.config, lengths.reshape(-1)).reshape(*positions.shape, -1)
            freqs = positions.float()[:, :, None] * inv_freq
        else:
            freqs = positions.float()[:, :, None] * self.table_inv_freq(table).float()[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        scale = rope.attention_factor
        if scale != 1.0:
            # Per column: the rotated dims' entries scaled, unrotated ones (partial rotary) kept at cos 1, sin 0, as
            # transformers passes those dims through.
            half, rotated = self.config.head_dim // 2, self.config.rope_dim // 2
            column = torch.ones(self.config.head_dim, dtype=cos.dtype, device=cos.device)
            column[:rotated] = scale
            column[half:half + rotated] = scale
            cos, sin = cos * column, sin * column
        return cos.to(dtype), sin.to(dtype)

    def layer_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`forward(positions, dtype, t)` for every table t of `config.rope_tables`, each computed once."""
        return [self(positions, dtype, t) for t in range(len(self.tables))]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys: x * cos + rotate_half(x) * sin (RoFormer, Su et al. 2021; HF Llama layout).

    Args:
        x: [batch, heads, seq, head_dim].
        cos, sin: [batch, seq, head_dim] from `RotaryEmbedding.forward`, same dtype as x (broadcast over heads).

    Returns:
        [batch, heads, seq, head_dim], same dtype as x.
    """
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
