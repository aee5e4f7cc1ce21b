"""Typed model configuration built from a Hugging Face `config.json`.

One `ModelConfig` describes every supported architecture: the eager model reads feature fields (biases,
q/k norms, sandwich norms, soft-capping, per-layer sliding windows) and never the architecture's name.
The per-architecture rules that turn a raw `config.json` into those fields live in `_ARCHITECTURE_RULES`,
mirroring how `transformers` defines each family (transformers/models/<family>/configuration_*.py and
modeling_*.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from solo.errors import CheckpointError, SoloError, UnsupportedArchitectureError
from solo.model.json_file import float_field, int_field, read_json_object

_SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "longrope", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding (RoPE) parameters.

    Attributes:
        theta: base of the rotary frequencies.
        rope_type: "default", "linear" (position interpolation), "dynamic" (dynamic NTK scaling), "llama3"
            (Llama 3.1 frequency-band scaling), "longrope" (Phi-3's LongRoPE) or "yarn" (YaRN: Qwen2.5 / Qwen3
            beyond 32k, DeepSeek). Formulas follow transformers' modeling_rope_utils.py.
        factor: scaling factor for the non-default types.
        low_freq_factor, high_freq_factor: llama3 band edges.
        original_max_position_embeddings: llama3's, longrope's and yarn's pre-training context length.
        short_factor, long_factor: longrope's per-frequency divisors ([head_dim // 2] each) for sequences
            within / beyond `original_max_position_embeddings`.
        attention_factor: longrope's and yarn's multiplier of cos and sin (1.0 for the other types).
        beta_fast, beta_slow: yarn's bounds, in rotations over the original context, of the frequencies kept
            (faster) and interpolated (slower); a ramp joins them.
        truncate: yarn rounds those bounds to whole dims (transformers' default).
        use_long_factor: longrope runs with `long_factor` at every position (the context Solo was given
            exceeds the original one; see `ModelConfig.with_context_length`), else with `short_factor`.
    """

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0
    use_long_factor: bool = False
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True

    @property
    def prefills_whole(self) -> bool:
        """Whether a prompt must be prefilled in one call, and no cached prefix reused.

        Dynamic NTK rotates every prompt token with the frequencies of the whole prompt's length (transformers);
        a chunk, a cached prefix or a token through the decode kernel would take another length's.
        """
        return self.rope_type == "dynamic"


LM_HEAD_TYPES = ("replicate", "pre_norm_lane_agg", "lane", "vocab_parallel")
"""`lm_head_type` values of lane models Solo implements (see `LaneConfig`)."""


@dataclass(frozen=True)
class LaneConfig:
    """Lane structure and Delayed Tensor Parallelism (DTP) of a lane model (Laneformer; ../shared/laneformer.md).

    Attributes:
        num_lanes: L, the lanes; each keeps its own residual stream and owns 1/L of every block's heads and
            FFN columns (lane-major).
        broadcast_delay: d, in layers: a lane adds the other lanes' partials of layer i at layer i + d.
        use_early_comm: the first d layers all-reduce at once (True) or add `sqrt(L) * own partial` (False).
        broadcast_attention_to_future, broadcast_mlp_to_future: per layer, whether that layer's attention /
            MLP partials are added by the other lanes d layers later (defaults as in the spec, section 6).
        lm_head_type: "replicate", "pre_norm_lane_agg", "lane" or "vocab_parallel".
    """

    num_lanes: int = 1
    broadcast_delay: int = 0
    use_early_comm: bool = True
    broadcast_attention_to_future: tuple[bool, ...] = ()
    broadcast_mlp_to_future: tuple[bool, ...] = ()
    lm_head_type: str = "replicate"


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder-only transformer needs to know about a checkpoint.

    Attributes:
        architecture: the Hugging Face class name, e.g. "LlamaForCausalLM".
        vocab_size, hidden_size, intermediate_size, num_layers: model dims.
        num_heads, num_kv_heads, head_dim: attention heads; `num_kv_heads < num_heads` is grouped-query
            attention (GQA).
        rms_norm_eps: epsilon of every RMSNorm.
        hidden_act: MLP activation: "silu", "gelu_pytorch_tanh" or "gelu".
        max_position_embeddings: the checkpoint's `max_position_embeddings`.
        context_length: longest sequence (prompt + generated) Solo accepts, in tokens: the checkpoint's
            (stretched by linear / dynamic RoPE scaling; a LongRoPE model's original context) unless
            `with_context_length` chose another.
        rope: RoPE parameters.
        tie_word_embeddings: the LM head reuses the token embedding matrix.
        qkv_bias, o_bias, mlp_bias: which projections carry a bias.
        qk_norm: per-head RMSNorm on queries and keys before RoPE (Qwen3).
        norm_unit_offset: RMSNorm multiplies by (1 + w) instead of w (Gemma).
        sandwich_norm: extra norms after attention and around the MLP (Gemma 2).
        embedding_scale: multiply token embeddings by this (Gemma: sqrt(hidden_size)), or None.
        attn_scale: softmax scale of attention scores.
        attn_logit_softcap, final_logit_softcap: tanh soft-capping of attention scores / logits, or None.
        layer_sliding_windows: per layer, the sliding-window size in tokens (a query sees itself and the
            `window - 1` tokens before it) or None for global attention.
        torch_dtype: the checkpoint's dtype name ("bfloat16", ...) or None when config.json omits it.
        bos_token_id: BOS id, or None.
        eos_token_ids: EOS ids from config.json (generation_config.json may add more).
        qk_norm_full_width: the q/k norms span the whole projection (num_heads * head_dim, OLMoE) instead
            of one head (Qwen3).
        num_experts: routed experts per mixture-of-experts (MoE) layer; 0 for a dense model.
        num_experts_per_tok: experts the router picks per token (top-k).
        moe_intermediate_size: hidden width of one routed expert.
        shared_expert_intermediate_size: width of the always-on shared expert (Qwen2-MoE), 0 when none.
        norm_topk_prob: renormalize the top-k router probabilities to sum to 1 (Mixtral always does).
        router_weights_fp32: the routing weights multiply the experts' outputs in float32 (Mixtral) rather
            than in the weights' dtype (Qwen-MoE, OLMoE).
        moe_layers: per layer, True when its MLP is a sparse MoE block (Qwen-MoE's decoder_sparse_step and
            mlp_only_layers make some layers dense); empty for a dense model.
        lanes: the lane structure of a lane model (Laneformer), or None for a dense model.
        rope_interleaved: RoPE rotates adjacent pairs (x[2i], x[2i+1]) (Meta's complex form) instead of
            the two halves of each head (transformers' rotate_half).
        layer_ropes: per layer, its own RoPE parameters, or None for a layer without position embeddings
            (NoPE: SmolLM3); empty when every layer takes `rope`. Gemma 3's sliding layers take a local
            theta (10000) and its global layers `rope`. See `rope_tables` / `layer_rope_table`.
        rotary_dim: dims of each query / key head that RoPE rotates (`partial_rotary_factor` x head_dim:
            Phi-4-mini's 96 of 128), or None for the whole head. See `rope_dim`.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    hidden_act: str
    max_position_embeddings: int
    context_length: int
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    norm_unit_offset: bool = False
    sandwich_norm: bool = False
    embedding_scale: float | None = None
    attn_scale: float = 1.0
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    layer_sliding_windows: tuple[int | None, ...] = ()
    torch_dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    qk_norm_full_width: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = False
    router_weights_fp32: bool = False
    moe_layers: tuple[bool, ...] = ()

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model (some layer routes tokens to experts)."""
        return any(self.moe_layers)

    def is_moe_layer(self, layer_idx: int) -> bool:
        """True when layer `layer_idx`'s MLP is a sparse MoE block."""
        return bool(self.moe_layers) and self.moe_layers[layer_idx]
    lanes: LaneConfig | None = None
    rope_interleaved: bool = False
    layer_ropes: tuple[RopeConfig | None, ...] = ()
    rotary_dim: int | None = None

    @property
    def rope_dim(self) -> int:
        """Dims of each head RoPE rotates (`rotary_dim`, else `head_dim`), at frequencies theta ** (-2i / rope_dim).

        Where it is less than head_dim (partial rotary embeddings) the loaded q and k projections' rows are
        reordered within each head (`solo.model.weights.rope_row_order`) so that the rotated dims' pairs sit
        at (i, i + head_dim / 2) as in a full rotation and the others in between, whose table entries are the
        identity (cos 1, sin 0): every runtime then runs them as a full rotation; q . k is unchanged, as the
        same order is applied to both.
        """
        return self.rotary_dim or self.head_dim

    @cached_property
    def rope_tables(self) -> tuple[RopeConfig | None, ...]:
        """The distinct RoPE tables the layers use: `rope` first, then every other layer's in layer order.

        None stands for a NoPE layer (its table is the identity: cos 1, sin 0). One entry unless the layers
        differ (`layer_ropes`).
        """
        tables: list[RopeConfig | None] = [self.rope]
        for rope in self.layer_ropes:
            if rope not in tables:
                tables.append(rope)
        return tuple(tables)

    @cached_property
    def _layer_rope_tables(self) -> tuple[int, ...]:
        return tuple(self.rope_tables.index(rope) for rope in self.layer_ropes)

    def layer_rope_table(self, layer_idx: int) -> int:
        """Index into `rope_tables` of layer `layer_idx`'s RoPE table."""
        return self._layer_rope_tables[layer_idx] if self.layer_ropes else 0

    def layer_uses_rope(self, layer_idx: int) -> bool:
        """False for a NoPE layer (no rotary embedding on its queries and keys)."""
        return not self.layer_ropes or self.layer_ropes[layer_idx] is not None

    @property
    def num_kv_groups(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.num_heads // self.num_kv_heads

    @property
    def max_context_length(self) -> int:
        """The longest `context_length` this checkpoint can be given (a LongRoPE model's long context)."""
        if self.rope.rope_type == "longrope":
            return self.max_position_embeddings
        return _context_length(self)

    def with_context_length(self, tokens: int) -> ModelConfig:
        """A copy of this config that accepts sequences of up to `tokens` (prompt + generated).

        A LongRoPE model (Phi-3) takes its short factors while the context stays within its original one, and
        its long factors at every position beyond (as llama.cpp chooses them from the context size):
        transformers switches per sequence, recomputing the KV cache when a sequence first outgrows the
        original context, so the default context (the original one) gives transformers' outputs for every
        sequence it accepts, and a longer one gives them for prompts longer than the original context.

        Args:
            tokens: the context, 2 <= tokens <= `max_context_length`.

        Raises:
            SoloError: `tokens` is not an integer in that range; the message names the longest allowed.
        """
        most = self.max_context_length
        if not isinstance(tokens, int) or isinstance(tokens, bool) or not 2 <= tokens <= most:
            raise SoloError(f"--max-model-len (context_length) must be an integer from 2 to {most}, this model's "
                            f"longest context; got {tokens!r}")
        rope = self.rope
        if rope.rope_type == "longrope":
            rope = replace(rope, use_long_factor=tokens > (rope.original_max_position_embeddings or most))
        return replace(self, context_length=tokens, rope=rope)

    def num_parameters(self) -> int:
        """Parameter count of the checkpoint (the LM head counted once when tied)."""
        h, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_heads * hd, self.num_kv_heads * hd
        attn = h * (q + 2 * kv) + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.o_bias:
            attn += h
        mlp = 3 * h * f + (2 * f + h if self.mlp_bias else 0)
        qk_norms = (q + kv if self.qk_norm_full_width else 2 * hd) if self.qk_norm else 0
        norms = h * (4 if self.sandwich_norm else 2) + qk_norms
        per_layer = attn + norms
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        if self.lanes is not None and self.lanes.lm_head_type == "lane":
            head *= self.lanes.num_lanes  # a [vocab, lanes * hidden] head
        mlps = sum(self._moe_parameters(self.num_experts) if self.is_moe_layer(i) else mlp
                   for i in range(self.num_layers))
        return self.num_layers * per_layer + mlps + embed + head + h

    def num_active_parameters(self) -> int:
        """Parameters one token reads: the top-k routed experts of each MoE layer, not all of them.

        Equal to `num_parameters()` for a dense model.
        """
        if not self.is_moe:
            return self.num_parameters()
        skipped = (self.num_experts - self.num_experts_per_tok) * 3 * self.hidden_size * self.moe_intermediate_size
        return self.num_parameters() - skipped * sum(self.moe_layers)

    def _moe_parameters(self, experts: int) -> int:
        # router + routed experts (+ shared expert and its sigmoid gate)
        h = self.hidden_size
        total = self.num_experts * h + experts * 3 * h * self.moe_intermediate_size
        if self.shared_expert_intermediate_size:
            total += 3 * h * self.shared_expert_intermediate_size + h
        return total

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build a config from the parsed contents of a Hugging Face `config.json`.

        Args:
            raw: the parsed JSON object.

        Returns:
            The validated config (context_length derived from the RoPE scaling, as vLLM does).

        Raises:
            UnsupportedArchitectureError: the architecture, or a feature it uses (a RoPE type, an
                activation, a pre-quantized format such as GPTQ), is not implemented; the message lists what
                is supported.
            CheckpointError: a required field is missing or inconsistent (e.g. `num_attention_heads` not a
                multiple of `num_key_value_heads`, or a `layer_types` list of the wrong length).
        """
        architecture = _architecture_name(raw)
        refuse_quantized_checkpoint(raw)
        if architecture in MULTIMODAL_ARCHITECTURES:
            raw = _language_model_config(raw)
        raw = {**_ABSENT_FIELD_DEFAULTS.get(architecture, {}), **raw}
        rule = _ARCHITECTURE_RULES[architecture]
        sizes = {key: int_field(raw, key) for key in
                 ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size")}
        sizes["num_key_value_heads"] = int_field(raw, "num_key_value_heads", sizes["num_attention_heads"])
        for key, value in sizes.items():  # (before head_dim divides by the head count)
            if value < 1:
                raise CheckpointError(f"config.json gives {key} = {value}; it must be >= 1. Fix or re-download it")
        head_dim = int_field(raw, "head_dim", 0) or sizes["hidden_size"] // sizes["num_attention_heads"]
        if head_dim < 1:
            raise CheckpointError(f"config.json gives head_dim = {head_dim}; it must be >= 1. Fix or re-download it")
        num_layers = sizes["num_hidden_layers"]
        base = dict(
            architecture=architecture,
            vocab_size=sizes["vocab_size"],
            hidden_size=sizes["hidden_size"],
            intermediate_size=sizes["intermediate_size"],
            num_layers=num_layers,
            num_heads=sizes["num_attention_heads"],
            num_kv_heads=sizes["num_key_value_heads"],
            head_dim=head_dim,
            rms_norm_eps=float_field(raw, "rms_norm_eps", 1e-6),
            hidden_act=str(raw.get("hidden_act", "silu")),
            max_position_embeddings=int_field(raw, "max_position_embeddings", 2048),
            context_length=0,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            torch_dtype=raw.get("dtype") or raw.get("torch_dtype"),  # (transformers 5 reads `dtype` first)
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_as_id_tuple(raw.get("eos_token_id")),
            layer_sliding_windows=(None,) * num_layers,
        )
        if not 0 <= base["rms_norm_eps"] < math.inf:
            raise CheckpointError(f"config.json gives rms_norm_eps = {base['rms_norm_eps']!r}; it must be a "
                                  "finite number >= 0. Fix or re-download it")
        base["attn_scale"] = base["head_dim"] ** -0.5
        base["rope"] = _rope_config(raw, architecture)
        base["rotary_dim"] = _rotary_dim(raw, architecture, base["head_dim"])
        config = cls(**base)
        try:
            config = rule(config, raw)
        except (TypeError, ValueError, AttributeError) as exc:
            # A field the rule reads has the wrong type (a null query_pre_attn_scalar, a string for a number, ...).
            raise CheckpointError(f"config.json has a {architecture} field of the wrong type or value ({exc}); "
                                  "fix or re-download it") from exc
        if not 2 <= config.max_position_embeddings < 2**31:  # (below 2 every request would be refused)
            raise CheckpointError(f"config.json gives max_position_embeddings = {config.max_position_embeddings}; "
                                  "it must be from 2 to 2**31 - 1. Fix or re-download it")
        config = replace(config, context_length=_context_length(config))
        _validate(config)
        return config

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        """Read `config.json` (or the folder holding it) into a `ModelConfig`.

        Raises:
            CheckpointError: the file is missing or is not valid JSON.
            UnsupportedArchitectureError: see `from_dict`.
        """
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            from solo.model.gguf import is_projector

            ggufs = sorted(f for f in path.parent.glob("*.gguf") if not is_projector(f))
            if ggufs:  # a folder of GGUF files: the file is what to load
                raise CheckpointError(f"{path} is missing, but the folder holds GGUF files: give one of them, "
                                      f"e.g. solo run {ggufs[0]}")
            raise CheckpointError(
                f"{path} is missing: a model folder needs config.json; point Solo at a complete "
                "Hugging Face model folder"
            )
        return cls.from_dict(read_json_object(path))


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _rope_config(raw: dict[str, Any], architecture: str) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters` (theta inside); older configs write `rope_theta` and
    # `rope_scaling` (with "type" in the oldest ones). With both, `rope_scaling` wins, as transformers 5
    # reads it: a user adds it to a saved config to stretch the context (model cards say so).
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise CheckpointError("config.json's rope_parameters and rope_scaling must be objects (or null); fix or "
                              "re-download it")
    merged = {**params, **scaling}
    if scaling and "original_max_position_embeddings" not in scaling:
        # (transformers 5 takes rope_scaling whole: a saved dict's original context does not carry over to it)
        merged.pop("original_max_position_embeddings", None)
    theta = merged.get("rope_theta", raw.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < math.inf:
        raise CheckpointError(f"config.json gives rope_theta = {theta!r}; it must be a positive number. Fix or "
                              "re-download it")
    theta = float(theta)
    # rope_scaling's type, in either spelling, wins over rope_parameters' (a user adds {"type": "linear", ...} to a
    # saved config). transformers 5 replaces rope_parameters by rope_scaling whole, so its theta falls back to
    # the top-level rope_theta or 10000; Solo keeps the saved theta, which the model was trained with.
    rope_type = (scaling.get("rope_type") or scaling.get("type") or params.get("rope_type") or params.get("type")
                 or "default")
    if rope_type in ("su", "yarn") and architecture == "Phi3ForCausalLM":
        rope_type = "longrope"  # Phi-3's early configs named LongRoPE so (transformers' Phi3Config maps them)
    if rope_type == "longrope":
        return _longrope_config(raw, merged, theta, architecture)
    if rope_type == "yarn":
        return _yarn_config(raw, merged, theta)
    if rope_type not in _SUPPORTED_ROPE_TYPES:
        raise UnsupportedArchitectureError(
            f"RoPE scaling type {rope_type!r} is not supported; Solo supports "
            f"{', '.join(_SUPPORTED_ROPE_TYPES)}"
        )
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(merged.get("factor", 1.0)),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=_original_context(raw, merged) if rope_type == "llama3" else None,
    )


def _original_context(raw: dict[str, Any], merged: dict[str, Any]) -> int:
    # transformers' `standardize_rope_params` for llama3, yarn and longrope: a top-level
    # original_max_position_embeddings wins over the RoPE dict's, and without either it is max_position_embeddings
    # (not Llama 3.1's 8192). A per-layer-type dict (Gemma 3) gets only the dict's or max_position_embeddings:
    # `_gemma3` passes no top-level value.
    original = raw.get("original_max_position_embeddings") or merged.get("original_max_position_embeddings") \
        or int_field(raw, "max_position_embeddings", 2048)
    if isinstance(original, bool) or not isinstance(original, (int, float)) or not 1 <= original < math.inf:
        raise CheckpointError(f"config.json gives original_max_position_embeddings = {original!r}; it must be a "
                              "number >= 1. Fix or re-download it")
    return int(original)


# Architectures whose transformers implementation rotates the first `partial_rotary_factor` x head_dim dims of
# each head in the rotate-half layout and passes the rest through (Phi3Attention: Phi-4-mini).
_PARTIAL_ROTARY_ARCHITECTURES = ("Phi3ForCausalLM",)


def _rotary_dim(raw: dict[str, Any], architecture: str, head_dim: int) -> int | None:
    # partial_rotary_factor sits at the top level (transformers 4) or in rope_parameters (transformers 5); a
    # rope_scaling beside them wins, as in `_rope_config` (transformers 5 takes rope_scaling whole then).
    factor = raw.get("partial_rotary_factor", 1.0)
    for key in ("rope_parameters", "rope_scaling"):
        section = raw.get(key)
        if isinstance(section, dict) and "partial_rotary_factor" in section:
            factor = section["partial_rotary_factor"]
    if factor is None:
        return None
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise CheckpointError(f"config.json gives partial_rotary_factor = {factor!r}; it must be in (0, 1]. Fix or "
                              "re-download it")
    if factor == 1:
        return None
    if architecture not in _PARTIAL_ROTARY_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"partial rotary embeddings (partial_rotary_factor {factor}) are supported for "
            f"{', '.join(_PARTIAL_ROTARY_ARCHITECTURES)} (Phi-4-mini), not for {architecture}")
    dim = int(head_dim * factor)  # as transformers' rope initialisation rounds it
    if dim < 2 or dim % 2:
        raise CheckpointError(f"partial_rotary_factor {factor} of a {head_dim}-dim head rotates {dim} dims; RoPE needs "
                              "an even number of at least 2. Fix or re-download config.json")
    return None if dim == head_dim else dim


def longrope_attention_factor(factor: float, original: int) -> float:
    """LongRoPE's cos/sin multiplier for a context stretched `factor` times beyond `original` tokens.

    sqrt(1 + ln(factor) / ln(original)), 1.0 when not stretched: Ding et al. 2024 ("LongRoPE"), as
    transformers' `_compute_longrope_parameters` and llama.cpp's converter compute it.
    """
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _longrope_config(raw: dict[str, Any], merged: dict[str, Any], theta: float, architecture: str) -> RopeConfig:
    # transformers' `_compute_longrope_parameters`. Phi3Config's original_max_position_embeddings (top level,
    # default 4096) replaces any inside the RoPE dict; other configs take the dict's, else max_position_embeddings.
    max_pos = int_field(raw, "max_position_embeddings", 2048)
    if architecture == "Phi3ForCausalLM":
        original = raw.get("original_max_position_embeddings", 4096)
    else:
        original = _original_context(raw, merged)
    try:
        original = int(original)
        short = tuple(float(f) for f in merged["short_factor"])
        long = tuple(float(f) for f in merged["long_factor"])
    except KeyError as exc:
        raise CheckpointError(f"config.json's longrope scaling lacks {exc.args[0]!r}; re-download config.json") \
            from None
    except (TypeError, ValueError):
        raise CheckpointError("config.json's longrope short_factor / long_factor must be lists of numbers and "
                              "original_max_position_embeddings an integer; fix or re-download it") from None
    if original < 1:
        raise CheckpointError(f"config.json gives original_max_position_embeddings = {original}; it must be >= 1. "
                              "Fix or re-download it")
    factor = float(merged.get("factor") or max_pos / original)
    attention = merged.get("attention_factor")
    if attention is None:
        attention = longrope_attention_factor(factor, original)
    return RopeConfig(theta=theta, rope_type="longrope", factor=factor, original_max_position_embeddings=original,
                      short_factor=short, long_factor=long, attention_factor=float(attention))


def _yarn_config(raw: dict[str, Any], merged: dict[str, Any], theta: float) -> RopeConfig:
    # transformers' `_compute_yarn_parameters` and `standardize_rope_params`: a top-level
    # original_max_position_embeddings wins over the dict's, else max_position_embeddings; without a factor,
    # max_position_embeddings / original; without an attention factor, YaRN's 0.1 ln(factor) + 1 (DeepSeek's
    # mscale / mscale_all_dim ratio when both are given).
    def number(key: str, value: Any, low: float) -> float:  # noqa: ANN401
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < math.inf:
            raise CheckpointError(f"config.json's yarn RoPE scaling gives {key} = {value!r}; it must be a number "
                                  f">= {low:g}. Fix or re-download it")
        return float(value)

    max_pos = int_field(raw, "max_position_embeddings", 2048)
    original = _original_context(raw, merged)
    factor = merged.get("factor")
    factor = number("factor", max_pos / original if factor is None else factor, 1)
    attention = merged.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = merged.get("mscale"), merged.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention = _yarn_mscale(factor, number("mscale", mscale, 0)) / \
                _yarn_mscale(factor, number("mscale_all_dim", mscale_all_dim, 0))
        else:
            attention = _yarn_mscale(factor)
    return RopeConfig(theta=theta, rope_type="yarn", factor=factor, original_max_position_embeddings=original,
                      attention_factor=number("attention_factor", attention, 0),
                      beta_fast=number("beta_fast", merged.get("beta_fast") or 32, 0),
                      beta_slow=number("beta_slow", merged.get("beta_slow") or 1, 0),
                      truncate=_yarn_truncate(merged.get("truncate", True)))


def _yarn_truncate(value: Any) -> bool:  # noqa: ANN401
    if not isinstance(value, bool):
        raise CheckpointError(f"config.json's yarn RoPE scaling gives truncate = {value!r}; it must be true or false. "
                              "Fix or re-download it")
    return value


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    # YaRN's attention temperature (Peng et al. 2023, "YaRN"), as transformers' get_mscale.
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


# Architectures whose max_position_embeddings already counts their RoPE scaling (vLLM makes Gemma 3 the same
# exception: its global layers' linear factor 8 took 32k of training to 128k).
_STATES_STRETCHED_CONTEXT = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")


def _context_length(config: ModelConfig) -> int:
    # As vLLM does: linear and dynamic scaling stretch the trained context by `factor`, yarn its original one; llama3
    # configs
    # already state the stretched length in max_position_embeddings. LongRoPE starts at its original context
    # (short factors, transformers' outputs); `with_context_length` goes beyond.
    if config.rope.rope_type in ("linear", "dynamic") and config.architecture not in _STATES_STRETCHED_CONTEXT:
        return int(config.max_position_embeddings * config.rope.factor)
    if config.rope.rope_type == "yarn":  # vLLM's: the original context times the factor (never below max_pos)
        return max(config.max_position_embeddings,
                   int((config.rope.original_max_position_embeddings or config.max_position_embeddings)
                       * config.rope.factor))
    if config.rope.rope_type == "longrope" and config.rope.original_max_position_embeddings:
        return min(config.rope.original_max_position_embeddings, config.max_position_embeddings)
    return config.max_position_embeddings


def _window(raw: dict[str, Any]) -> int | None:
    # A sliding_window of 0 (or null) means no window, as llama.cpp reads it (Phi-4's GGUF files write 0).
    return raw.get("sliding_window") or None


def _layer_windows_from_types(raw: dict[str, Any], num_layers: int, window: int | None) -> tuple:
    sliding = _sliding_layers(raw, num_layers)
    if sliding is None:
        return (None,) * num_layers
    return tuple(window if s else None for s in sliding)


def _sliding_layers(raw: dict[str, Any], num_layers: int) -> list[bool] | None:
    # Per layer, whether config.json's layer_types makes it a sliding_attention layer; None without layer_types.
    layer_types = raw.get("layer_types")
    if layer_types is None:
        return None
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        shown = f"{len(layer_types)} layer_types" if isinstance(layer_types, list) else f"layer_types {layer_types!r}"
        raise CheckpointError(f"config.json lists {shown} for {num_layers} layers; fix config.json")
    if not all(isinstance(t, str) for t in layer_types):
        raise CheckpointError(f"config.json's layer_types must be strings, got {layer_types!r}; fix config.json")
    unknown = sorted(set(layer_types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise UnsupportedArchitectureError(f"layer type {unknown[0]!r} (config.json layer_types) is not supported; "
                                           "Solo runs sliding_attention and full_attention layers")
    return [t == "sliding_attention" for t in layer_types]


def _llama(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    bias = bool(raw.get("attention_bias", False))
    return replace(config, qkv_bias=bias, o_bias=bias, mlp_bias=bool(raw.get("mlp_bias", False)))


def _mistral(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    return replace(config, layer_sliding_windows=(_window(raw),) * config.num_layers)


def _qwen_windows(config: ModelConfig, raw: dict[str, Any]) -> tuple:
    # transformers: the window is only active with use_sliding_window, and then only from
    # max_window_layers on, unless config.json spells out layer_types.
    window = _window(raw) if raw.get("use_sliding_window", False) else None
    if raw.get("layer_types") is not None:
        return _layer_windows_from_types(raw, config.num_layers, window)
    first = int(raw.get("max_window_layers", config.num_layers))
    return tuple(window if window is not None and i >= first else None for i in range(config.num_layers))


def _qwen2(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    return replace(config, qkv_bias=True, layer_sliding_windows=_qwen_windows(config, raw))


def _qwen3(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    bias = bool(raw.get("attention_bias", False))
    return replace(
        config, qkv_bias=bias, o_bias=bias, qk_norm=True, layer_sliding_windows=_qwen_windows(config, raw)
    )


def _gemma_fields(config: ModelConfig, raw: dict[str, Any], windows: tuple, softcaps: tuple) -> ModelConfig:
    # What Gemma 2 and Gemma 3 share: (1 + w) norms, sandwich norms, scaled embeddings, query_pre_attn_scalar.
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedArchitectureError("bidirectional attention (use_bidirectional_attention) is not supported")
    bias = bool(raw.get("attention_bias", False))
    attn_cap, final_cap = softcaps
    return replace(
        config,
        qkv_bias=bias,
        o_bias=bias,
        norm_unit_offset=True,
        sandwich_norm=True,
        hidden_act=str(raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"),
        embedding_scale=math.sqrt(config.hidden_size),
        attn_scale=float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        attn_logit_softcap=raw.get("attn_logit_softcapping", attn_cap),
        final_logit_softcap=raw.get("final_logit_softcapping", final_cap),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        layer_sliding_windows=windows,
    )


def _gemma2(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    window = raw.get("sliding_window", 4096)
    if raw.get("layer_types") is None:
        # Gemma 2 alternates: even layers slide, odd layers are global.
        windows = tuple(window if i % 2 == 0 else None for i in range(config.num_layers))
    else:
        windows = _layer_windows_from_types(raw, config.num_layers, window)
    config = replace(config, max_position_embeddings=int_field(raw, "max_position_embeddings", 8192))
    return _gemma_fields(config, raw, windows, (50.0, 30.0))


def _gemma3(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    # transformers' Gemma3TextConfig: five sliding layers then a global one (sliding_window_pattern 6) unless
    # layer_types says otherwise; per-head q/k norms; no soft-capping; the global layers' RoPE (theta 1e6,
    # any rope_scaling) differs from the sliding layers' (rope_local_base_freq, 10000).
    # A layer's type picks both its window and its RoPE table (sliding_window null leaves the tables as they are).
    window = raw.get("sliding_window", 4096)
    sliding = _sliding_layers(raw, config.num_layers)
    if sliding is None:
        pattern = int(raw.get("sliding_window_pattern") or 6)
        sliding = [bool((i + 1) % pattern) for i in range(config.num_layers)]
    windows = tuple(window if s else None for s in sliding)
    params = raw.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:  # transformers >= 5
        full, local = dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
        full.update(raw.get("rope_scaling") or {})
    else:  # older configs: rope_theta and rope_scaling for the global layers, rope_local_base_freq
        full, local = {**params, **(raw.get("rope_scaling") or {})}, {}
    full.setdefault("rope_theta", raw.get("rope_theta", 1_000_000.0))
    local.setdefault("rope_theta", raw.get("rope_local_base_freq", 10_000.0))
    # As transformers' per-layer-type RoPE: a scaled type's original context is its dict's or
    # max_position_embeddings (never a top-level one), and yarn's `truncate` is read from the outer rope_parameters
    # (so true unless set there), whatever the layer type's own dict says.
    for section in (full, local):
        if section.get("rope_type", section.get("type")) == "yarn":
            section["truncate"] = params.get("truncate", True)
    max_pos = int_field(raw, "max_position_embeddings", 131_072)
    arch = config.architecture
    global_rope = _rope_config({"rope_parameters": full, "max_position_embeddings": max_pos}, arch)
    local_rope = _rope_config({"rope_parameters": local, "max_position_embeddings": max_pos}, arch)
    config = replace(config, qk_norm=True, rope=global_rope,
                     max_position_embeddings=max_pos,
                     layer_ropes=tuple(local_rope if s else global_rope for s in sliding))
    config = _gemma_fields(config, raw, windows, (None, None))
    return replace(config, attn_logit_softcap=None)  # transformers' Gemma3Attention never applies it


def _smollm3(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    # transformers' SmolLM3Config: Llama blocks; no_rope_layers[i] is 1 where layer i uses RoPE and 0 where it
    # has none (NoPE), by default every fourth layer (no_rope_layer_interval); a sliding window, when used, only
    # on NoPE layers unless layer_types says otherwise.
    n = config.num_layers
    uses_rope = raw.get("no_rope_layers")
    if uses_rope is None:
        interval = raw.get("no_rope_layer_interval", 4)
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
            raise CheckpointError(f"config.json gives no_rope_layer_interval = {interval!r}; it must be an integer "
                                  ">= 1. Fix or re-download it")
        uses_rope = [int((i + 1) % interval != 0) for i in range(n)]
    # transformers reads the first num_hidden_layers entries of a longer list
    if not isinstance(uses_rope, list) or len(uses_rope) < n or any(u not in (0, 1) for u in uses_rope[:n]):
        raise CheckpointError(f"config.json's no_rope_layers must list 1 (RoPE) or 0 (none) for each of the {n} "
                              f"layers, got {uses_rope!r}; fix config.json")
    if not (raw.get("rope_parameters") or {}).get("rope_theta") and "rope_theta" not in raw:
        config = replace(config, rope=replace(config.rope, theta=2_000_000.0))  # SmolLM3Config's default
    if raw.get("max_position_embeddings") is None:
        config = replace(config, max_position_embeddings=32768)
    window = _window(raw) if raw.get("use_sliding_window", False) else None
    if raw.get("layer_types") is not None:
        windows = _layer_windows_from_types(raw, n, window)
    else:
        windows = tuple(window if not uses_rope[i] else None for i in range(n))
    config = _llama(config, raw)
    return replace(config, layer_sliding_windows=windows,
                   tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
                   layer_ropes=tuple(config.rope if uses_rope[i] else None for i in range(n)))


def _moe_fields(config: ModelConfig, raw: dict[str, Any], experts_key: str, expert_width_key: str,
                defaults: tuple[int, int, int], moe_layers: tuple[bool, ...] | None = None,
                **fields: Any) -> ModelConfig:
    # Shared by the MoE families: transformers' configuration_{mixtral,qwen2_moe,qwen3_moe,olmoe}.py, whose
    # defaults (experts, top-k, expert width) apply where config.json omits a field.
    try:
        experts = int(raw.get(experts_key) or raw.get("num_experts") or raw.get("num_local_experts") or defaults[0])
        top_k = int(raw.get("num_experts_per_tok") or defaults[1])
        width = int(raw.get(expert_width_key) or defaults[2])
    except (TypeError, ValueError):
        raise CheckpointError("config.json has a non-integer expert field (num_experts, num_experts_per_tok or "
                              f"{expert_width_key}); fix or re-download it") from None
    if experts < 1 or width < 1 or not 1 <= top_k <= experts:
        raise CheckpointError(
            f"config.json gives {experts} experts of width {width} with num_experts_per_tok = {top_k}; a "
            "mixture-of-experts model needs >= 1 expert, a positive width and 1 <= num_experts_per_tok <= "
            "num_experts. Fix or re-download it"
        )
    return replace(config, num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=width,
                   moe_layers=moe_layers or (True,) * config.num_layers, **fields)


def _qwen_moe_layers(config: ModelConfig, raw: dict[str, Any]) -> tuple[bool, ...]:
    # transformers' Qwen2MoeDecoderLayer: sparse unless listed in mlp_only_layers or off the sparse step.
    step = int(raw.get("decoder_sparse_step") or 1)
    dense = set(raw.get("mlp_only_layers") or ())
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(config.num_layers))


def _mixtral(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    config = _mistral(config, raw)
    # Mixtral always renormalizes the top-k and keeps the routing weights in float32.
    return _moe_fields(config, raw, "num_local_experts", "intermediate_size", (8, 2, 14336), norm_topk_prob=True,
                       router_weights_fp32=True)


def _qwen2_moe(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    window = _window(raw) if raw.get("use_sliding_window", False) else None
    if raw.get("layer_types") is not None:
        windows = _layer_windows_from_types(raw, config.num_layers, window)
    else:
        # transformers 5's Qwen2MoeConfig: odd-numbered layers (1st, 3rd, ...) below max_window_layers slide.
        first = int(raw.get("max_window_layers", config.num_layers))
        windows = tuple(window if window is not None and (i + 1) % 2 and i < first else None
                        for i in range(config.num_layers))
    config = replace(config, qkv_bias=bool(raw.get("qkv_bias", True)), layer_sliding_windows=windows)
    return _moe_fields(config, raw, "num_experts", "moe_intermediate_size", (60, 4, 1408),
                       _qwen_moe_layers(config, raw), norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
                       shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size", 5632) or 0))


def _qwen3_moe(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    bias = bool(raw.get("attention_bias", False))
    window = _window(raw) if raw.get("use_sliding_window", False) else None
    config = replace(config, qkv_bias=bias, o_bias=bias, qk_norm=True,
                     layer_sliding_windows=(window,) * config.num_layers)
    return _moe_fields(config, raw, "num_experts", "moe_intermediate_size", (128, 8, 768),
                       _qwen_moe_layers(config, raw), norm_topk_prob=bool(raw.get("norm_topk_prob", False)))


def _olmoe(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    if raw.get("clip_qkv") is not None:
        raise UnsupportedArchitectureError("OLMoE's clip_qkv (clamping q/k/v) is not supported; Solo runs "
                                           "OLMoE checkpoints with clip_qkv null")
    bias = bool(raw.get("attention_bias", False))
    # OLMoE's q/k norms span the whole q / k projection (transformers' OlmoeAttention), not one head.
    config = replace(config, qkv_bias=bias, o_bias=bias, qk_norm=True, qk_norm_full_width=True)
    return _moe_fields(config, raw, "num_experts", "intermediate_size", (64, 8, 2048),
                       norm_topk_prob=bool(raw.get("norm_topk_prob", False)))


def _laneformer(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    from solo.model.lane_config import laneformer_config

    return laneformer_config(config, raw)


_ARCHITECTURE_RULES: dict[str, Callable[[ModelConfig, dict[str, Any]], ModelConfig]] = {
    "LlamaForCausalLM": _llama,
    "MistralForCausalLM": _mistral,
    "Qwen2ForCausalLM": _qwen2,
    "Qwen3ForCausalLM": _qwen3,
    "Gemma2ForCausalLM": _gemma2,
    "Gemma3ForCausalLM": _gemma3,
    # gemma-3-4b/12b/27b: the language model of the image-text checkpoint (solo.model.weights skips the rest)
    "Gemma3ForConditionalGeneration": _gemma3,
    "SmolLM3ForCausalLM": _smollm3,
    "MixtralForCausalLM": _mixtral,
    "Qwen2MoeForCausalLM": _qwen2_moe,
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "OlmoeForCausalLM": _olmoe,
    # transformers' Phi3 is Llama's blocks with fused qkv_proj / gate_up_proj (split at load time, see
    # solo.model.weights.split_fused_tensor), no biases and one sliding window on every layer: Mistral's rule.
    "Phi3ForCausalLM": _mistral,
    "LaneformerForCausalLM": _laneformer,
}

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_ARCHITECTURE_RULES)
"""Hugging Face architecture names Solo runs."""

# Fields a config.json may leave out whose transformers default (the architecture's config class) differs from
# the default Solo reads for every architecture (2048 positions, eps 1e-6, theta 10000, as many KV heads as query
# heads, hidden_size / heads per head, no window, no token ids): a config.json without them reads as transformers
# reads it. Only absent fields: an explicit null is each field's null (tests/model/test_config.py checks the table
# against transformers).
_ABSENT_FIELD_DEFAULTS: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": {"bos_token_id": 1, "eos_token_id": 2},
    "MistralForCausalLM": {"num_key_value_heads": 8, "max_position_embeddings": 131072, "sliding_window": 4096,
                           "bos_token_id": 1, "eos_token_id": 2},
    "Qwen2ForCausalLM": {"num_key_value_heads": 32, "max_position_embeddings": 32768},
    "Qwen3ForCausalLM": {"num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768},
    "Gemma2ForCausalLM": {"num_key_value_heads": 4, "head_dim": 256, "bos_token_id": 2, "eos_token_id": 1},
    "Gemma3ForCausalLM": {"num_key_value_heads": 4, "head_dim": 256, "bos_token_id": 2, "eos_token_id": 1},
    "SmolLM3ForCausalLM": {"num_key_value_heads": 4, "bos_token_id": 128000, "eos_token_id": 128001},
    "MixtralForCausalLM": {"num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                           "rope_theta": 1_000_000.0, "bos_token_id": 1, "eos_token_id": 2},
    "Qwen2MoeForCausalLM": {"num_key_value_heads": 16, "max_position_embeddings": 32768},
    "Qwen3MoeForCausalLM": {"num_key_value_heads": 4, "max_position_embeddings": 32768},
    "OlmoeForCausalLM": {"max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "eos_token_id": 50279},
    "Phi3ForCausalLM": {"max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "bos_token_id": 1,
                        "eos_token_id": 32000},
}

_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "smollm3": "SmolLM3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "laneformer": "LaneformerForCausalLM",
}

_SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu")


MULTIMODAL_ARCHITECTURES: tuple[str, ...] = ("Gemma3ForConditionalGeneration",)
"""Image-text checkpoints whose language model Solo runs on text (the vision tower is never loaded)."""


def _language_model_config(raw: dict[str, Any]) -> dict[str, Any]:
    # Gemma3Config keeps the language model's fields in text_config, which the published configs write
    # sparsely (gemma-3-4b-it: 6 fields); transformers' Gemma3TextConfig supplies the rest, as it does when
    # transformers loads the checkpoint. Token ids and the dtype stay at the top level.
    from transformers import Gemma3TextConfig

    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointError("config.json of an image-text model lacks its text_config object; re-download it")
    known = {k: v for k, v in text.items() if k not in ("architectures", "model_type")}
    try:
        merged = Gemma3TextConfig(**known).to_dict()
    except Exception as exc:  # noqa: BLE001 (transformers' strict-dataclass validation errors subclass Exception)
        reason = " ".join(str(exc).split())  # transformers' validation errors span lines
        raise CheckpointError(f"config.json's text_config cannot be read ({reason}); fix or re-download it") from None
    merged["architectures"] = list(listed_architectures(raw) or ["Gemma3ForConditionalGeneration"])
    for key in ("eos_token_id", "bos_token_id", "torch_dtype", "dtype"):
        if raw.get(key) is not None:
            merged[key] = raw[key]
    return merged


def listed_architectures(raw: Mapping[str, Any]) -> Any:  # noqa: ANN401
    """config.json's `architectures` as a list (none: []).

    One class name given as a string, as transformers takes it too, is that name in a list; other values come
    back as they are, for the caller to refuse.
    """
    names = raw.get("architectures") or []
    return [names] if isinstance(names, str) else names


def _architecture_name(raw: dict[str, Any]) -> str:
    names = listed_architectures(raw)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"config.json gives architectures = {names!r:.80}; it must be a list of class names "
                              "such as [\"LlamaForCausalLM\"]. Fix or re-download it")
    if not names and raw.get("model_type") in _MODEL_TYPES:
        names = [_MODEL_TYPES[raw["model_type"]]]
    for name in names:
        if name in _ARCHITECTURE_RULES:
            return name
    if not names and raw.get("model_type") is None:
        raise UnsupportedArchitectureError(
            "config.json names no architecture (neither `architectures` nor `model_type` is set); it is "
            f"damaged or not a transformers model config. Solo supports {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    shown = ", ".join(names) if names else f"model_type {raw.get('model_type')!r}"
    raise UnsupportedArchitectureError(
        f"unsupported architecture {shown}; Solo supports {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _validate(config: ModelConfig) -> None:
    bad_window = next((w for w in config.layer_sliding_windows if w is not None
                       and (not isinstance(w, int) or isinstance(w, bool) or w < 1)), None)
    if bad_window is not None:
        raise CheckpointError(f"config.json gives sliding_window = {bad_window!r}; it must be a positive integer (or "
                              "null for none). Fix or re-download it")
    if config.hidden_act not in _SUPPORTED_ACTIVATIONS:
        raise UnsupportedArchitectureError(
            f"activation {config.hidden_act!r} is not supported; Solo supports {', '.join(_SUPPORTED_ACTIVATIONS)}"
        )
    if config.num_heads % config.num_kv_heads != 0:
        raise CheckpointError(
            f"num_attention_heads ({config.num_heads}) is not a multiple of num_key_value_heads "
            f"({config.num_kv_heads}); fix config.json"
        )
    for layer_rope in config.layer_ropes:
        if layer_rope is not None and layer_rope.rope_type in ("dynamic", "longrope"):
            raise UnsupportedArchitectureError(
                f"{layer_rope.rope_type} RoPE scaling is not supported on a model whose layers take different RoPE "
                "tables (Gemma 3's local layers, SmolLM3's NoPE layers); Solo supports default, linear and llama3 "
                "scaling there"
            )
    rope = config.rope
    if rope.rope_type == "longrope" and not len(rope.short_factor) == len(rope.long_factor) == config.rope_dim // 2:
        rotated = f"{config.rope_dim} rotated dims" if config.rotary_dim else f"a head of {config.head_dim}"
        raise CheckpointError(
            f"config.json's longrope short_factor and long_factor have {len(rope.short_factor)} and "
            f"{len(rope.long_factor)} entries; {rotated} need{'s' if config.rotary_dim is None else ''} "
            f"{config.rope_dim // 2} each. Fix "
            "or re-download config.json"
        )
    if config.rotary_dim is not None and (rope.rope_type == "dynamic" or config.layer_ropes or config.rope_interleaved):
        raise UnsupportedArchitectureError(
            "partial rotary embeddings are supported with static RoPE tables shared by every layer (Phi-4-mini's "
            "LongRoPE), not with dynamic NTK scaling, per-layer tables or interleaved pairs")


# quant_method of config.json's quantization_config -> the name users know it by.
_QUANT_FORMATS = {
    "gptq": "GPTQ", "awq": "AWQ", "bitsandbytes": "bitsandbytes", "fp8": "FP8", "fbgemm_fp8": "FP8",
    "compressed-tensors": "compressed-tensors", "aqlm": "AQLM", "exl2": "EXL2", "hqq": "HQQ", "eetq": "EETQ",
    "quanto": "Quanto", "torchao": "torchao", "bitnet": "BitNet", "mxfp4": "MXFP4", "marlin": "Marlin",
    "gptq_marlin": "GPTQ", "awq_marlin": "AWQ", "higgs": "HIGGS", "vptq": "VPTQ", "spqr": "SpQR",
}


def refuse_quantized_checkpoint(raw: dict[str, Any]) -> None:
    """Refuse, by name, a checkpoint whose weights are stored pre-quantized (GPTQ, AWQ, bitsandbytes, FP8, ...).

    Solo reads float32/bfloat16/float16 safetensors (and quantizes them itself with --quantize int8/int4).

    Raises:
        UnsupportedArchitectureError: config.json has a `quantization_config` (or bitsandbytes' load_in_*bit).
    """
    quant = raw.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower() if isinstance(quant, dict) else ""
    if not method and isinstance(quant, dict) and (quant.get("load_in_4bit") or quant.get("load_in_8bit")):
        method = "bitsandbytes"
    if not method and not quant:
        return
    name = _QUANT_FORMATS.get(method, method or "pre-quantized")
    raise UnsupportedArchitectureError(
        f"this checkpoint's weights are {name}-quantized (config.json quantization_config), a format Solo cannot "
        "run; use the original float16/bfloat16 checkpoint (Solo quantizes it itself with --quantize int8 or "
        "int4) or a GGUF file"
    )
