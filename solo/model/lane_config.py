"""Reading a Laneformer `config.json` into `ModelConfig` + `LaneConfig` (spec: ../shared/laneformer.md, section 6).

The field names are those the spec lists; values Solo does not implement are refused with a message that
names the field, never silently ignored.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from solo.errors import CheckpointError, UnsupportedArchitectureError
from solo.model.config import LM_HEAD_TYPES, LaneConfig, ModelConfig
from solo.model.json_file import int_field


def default_broadcast_flags(num_layers: int, delay: int, use_early_comm: bool) -> tuple[bool, ...]:
    """The spec's default per-layer `broadcast_*_to_future` flags (section 6).

    With early communication the first `delay` layers (already all-reduced) and the last `delay` layers
    (nobody would consume them) do not broadcast; without it only the last `delay` layers do not.

    Returns:
        One bool per layer.
    """
    first = delay if use_early_comm else 0
    return tuple(first <= i < num_layers - delay for i in range(num_layers))


def _flag_list(raw: dict[str, Any], key: str, num_layers: int, default: tuple[bool, ...]) -> tuple[bool, ...]:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, list) or len(value) != num_layers or not all(isinstance(v, bool) for v in value):
        raise CheckpointError(f"config.json: {key} must be a list of {num_layers} booleans (one per layer); fix it")
    return tuple(value)


def _positive_int(raw: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = raw.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CheckpointError(f"config.json: {key} = {value!r}; it must be an integer >= {minimum}")
    return value


def laneformer_config(config: ModelConfig, raw: dict[str, Any]) -> ModelConfig:
    """The architecture rule of `LaneformerForCausalLM`: lane fields, interleaved RoPE, sliding windows.

    Args:
        config: the generic config built from the Hugging Face size fields.
        raw: the parsed config.json.

    Returns:
        `config` with `lanes`, `rope_interleaved`, `rms_norm_eps` (from `norm_eps`) and per-layer windows.

    Raises:
        UnsupportedArchitectureError: a lane feature Solo does not implement (an unknown `lm_head_type`,
            `use_attention_comm` / `use_mlp_comm` false, per-lane norm scales, dynamic RoPE, biases, an
            activation other than silu); the message names the field.
        CheckpointError: inconsistent values (lanes that do not divide the heads, a bad flag list, ...).
    """
    n = config.num_layers
    lanes = _positive_int(raw, "num_lanes", 1, 1)
    delay = _positive_int(raw, "broadcast_delay", 0, 0)
    if delay > n:
        raise CheckpointError(f"config.json: broadcast_delay = {delay} exceeds num_hidden_layers = {n}")
    early = raw.get("use_early_comm", True)
    if not isinstance(early, bool):
        raise CheckpointError(f"config.json: use_early_comm must be true or false, got {early!r}")
    head_type = raw.get("lm_head_type", "replicate")
    if head_type not in LM_HEAD_TYPES:
        raise UnsupportedArchitectureError(
            f"lm_head_type {head_type!r} is not implemented; Solo supports {', '.join(LM_HEAD_TYPES)}"
        )
    for key in ("use_attention_comm", "use_mlp_comm"):
        if raw.get(key, True) is not True:
            raise UnsupportedArchitectureError(f"{key} = {raw[key]!r} is not implemented; Solo supports true only")
    if raw.get("replicated_rmsn_scale", True) is not True:
        raise UnsupportedArchitectureError(
            "replicated_rmsn_scale = false (one norm scale per lane) is not implemented; Solo supports true only"
        )
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            raise UnsupportedArchitectureError(f"{key} = true is not implemented for Laneformer models")
    if config.hidden_act != "silu":
        raise UnsupportedArchitectureError(
            f"hidden_act {config.hidden_act!r} is not implemented for Laneformer models; Solo supports silu"
        )
    if config.rope.rope_type in ("dynamic", "longrope", "yarn"):  # their tables scale cos/sin or vary per length
        raise UnsupportedArchitectureError(
            f"{config.rope.rope_type} RoPE scaling is not implemented for Laneformer models; Solo supports default, "
            "linear, llama3"
        )
    for name, value in (("num_attention_heads", config.num_heads), ("num_key_value_heads", config.num_kv_heads),
                        ("intermediate_size", config.intermediate_size)):
        if value % lanes:
            raise CheckpointError(f"config.json: {name} = {value} is not a multiple of num_lanes = {lanes}")
    if head_type == "vocab_parallel" and config.vocab_size % lanes:
        raise CheckpointError(
            f"config.json: lm_head_type vocab_parallel needs vocab_size ({config.vocab_size}) to be a multiple "
            f"of num_lanes ({lanes})"
        )
    if head_type == "lane" and config.tie_word_embeddings:
        raise CheckpointError("config.json: lm_head_type lane has a [vocab, lanes * hidden] head; it cannot be tied")
    if config.head_dim % 2:
        raise CheckpointError(f"config.json: head_dim {config.head_dim} is odd; interleaved RoPE needs pairs")
    default = default_broadcast_flags(n, delay, early)
    lane = LaneConfig(
        num_lanes=lanes,
        broadcast_delay=delay,
        use_early_comm=early,
        broadcast_attention_to_future=_flag_list(raw, "broadcast_attention_to_future", n, default),
        broadcast_mlp_to_future=_flag_list(raw, "broadcast_mlp_to_future", n, default),
        lm_head_type=head_type,
    )
    window = raw.get("sliding_window")
    windows: tuple[int | None, ...] = (None,) * n
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise CheckpointError(f"config.json: sliding_window = {window!r}; it must be a positive integer or null")
        first = _positive_int(raw, "sliding_window_n_layers", n, 0)
        if first > n:
            raise CheckpointError(f"config.json: sliding_window_n_layers = {first} exceeds num_hidden_layers = {n}")
        windows = tuple(window if i < first else None for i in range(n))
    eps = raw.get("norm_eps", raw.get("rms_norm_eps", 1e-5))
    if not isinstance(eps, int | float) or isinstance(eps, bool) or not math.isfinite(eps) or eps <= 0:
        raise CheckpointError(f"config.json: norm_eps = {eps!r}; it must be a positive number")
    return replace(
        config, lanes=lane, rope_interleaved=True, rms_norm_eps=float(eps), layer_sliding_windows=windows,
        max_position_embeddings=int_field(raw, "max_position_embeddings", 4096),
    )
