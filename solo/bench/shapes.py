"""Real model shapes with random weights, so decode speed can be measured without downloading weights.

Each shape is the `config.json` of a public model reduced to the fields that set its size and
architecture (dims as published by the model's authors); `build_model` runs it through the normal
`ModelConfig.from_dict` and builds the eager `Transformer` with random weights of the requested dtype.
Speed depends only on shapes and dtypes, not on the values, so the numbers hold for the real weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from solo.errors import SoloError
from solo.model.config import ModelConfig
from solo.model.rope import RotaryEmbedding
from solo.model.transformer import Transformer

SHAPES: dict[str, dict[str, Any]] = {
    "SmolLM2-135M": dict(
        architectures=["LlamaForCausalLM"], hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
        rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192, torch_dtype="bfloat16",
    ),
    "Qwen2.5-0.5B": dict(
        architectures=["Qwen2ForCausalLM"], hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
        rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768, torch_dtype="bfloat16",
    ),
    "Llama-3.2-1B": dict(
        architectures=["LlamaForCausalLM"], hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
        rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072, torch_dtype="bfloat16",
        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
    ),
    "Llama-3.1-8B": dict(
        architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
        tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
        torch_dtype="bfloat16",
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
    ),
    # microsoft/Phi-3-mini-4k-instruct: multi-head attention (32 KV heads, head_dim 96) and a 2047-token window.
    "Phi-3-mini": dict(
        architectures=["Phi3ForCausalLM"], hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=32064, tie_word_embeddings=False,
        rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096, sliding_window=2047,
        torch_dtype="bfloat16",
    ),
    # microsoft/Phi-4-mini-instruct: a Phi-3 whose RoPE rotates 96 of each head's 128 dims, GQA (8 KV heads), a
    # 200k vocabulary (tied), LongRoPE from a 4096-token original context (the shape runs within it, on the
    # short factors; these are placeholders of the published lists' length, 48 each).
    "Phi-4-mini": dict(
        architectures=["Phi3ForCausalLM"], hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=24, num_key_value_heads=8, vocab_size=200064, tie_word_embeddings=True,
        rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=131072, original_max_position_embeddings=4096,
        partial_rotary_factor=0.75, sliding_window=262144, torch_dtype="bfloat16",
        rope_scaling=dict(type="longrope", short_factor=[1.0] * 48, long_factor=[1.0 + 0.5 * i for i in range(48)]),
    ),
    # google/gemma-3-1b-it: five 512-token sliding layers then a global one, RoPE theta 10000 on the sliding
    # layers and 1e6 on the global ones, a 262k vocabulary (tied: 0.3 of the 1.0B parameters).
    "Gemma-3-1B": dict(
        architectures=["Gemma3ForCausalLM"], hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144, tie_word_embeddings=True,
        rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window=512,
        sliding_window_pattern=6, query_pre_attn_scalar=256, max_position_embeddings=32768,
        hidden_activation="gelu_pytorch_tanh", torch_dtype="bfloat16",
    ),
    # HuggingFaceTB/SmolLM3-3B: Llama blocks, every fourth layer without RoPE (NoPE).
    "SmolLM3-3B": dict(
        architectures=["SmolLM3ForCausalLM"], hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=4, vocab_size=128256, tie_word_embeddings=True,
        rms_norm_eps=1e-6, rope_theta=5000000.0, no_rope_layer_interval=4, max_position_embeddings=65536,
        torch_dtype="bfloat16",
    ),
    # A lane model (solo.model.lanes; ../shared/laneformer.md section 2): 8 lanes, delay 2, a 2048-token
    # sliding window on layers 0-9.
    "Laneformer-2B": dict(
        architectures=["LaneformerForCausalLM"], model_type="laneformer", hidden_size=3072,
        intermediate_size=12288, num_hidden_layers=15, num_attention_heads=32, num_key_value_heads=16,
        head_dim=96, vocab_size=32000, tie_word_embeddings=False, norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=4096, torch_dtype="bfloat16", num_lanes=8, broadcast_delay=2,
        lm_head_type="replicate", use_early_comm=True, sliding_window=2048, sliding_window_n_layers=10,
    ),
    # The dense Llama of Laneformer-2B's dimensions (the same bytes per decode token), to compare the lane
    # runtime with the dense one at equal size.
    "Laneformer-2B-dense": dict(
        architectures=["LlamaForCausalLM"], hidden_size=3072, intermediate_size=12288, num_hidden_layers=15,
        num_attention_heads=32, num_key_value_heads=16, head_dim=96, vocab_size=32000, tie_word_embeddings=False,
        rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096, torch_dtype="bfloat16",
    ),
    # Mixture-of-experts shapes that fit a 24 GiB machine in bfloat16. OLMoE-1B-7B is the real model
    # (allenai/OLMoE-1B-7B-0924: 6.9B parameters, 1.3B active, 13.8 GB). Qwen3-30B-A3B (61 GB) is scaled
    # down: its exact layer shapes (128 experts, top-8, GQA 32/4) with 8 of its 48 layers (5.6B, 11 GB).
    "OLMoE-1B-7B": dict(
        architectures=["OlmoeForCausalLM"], hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, vocab_size=50304, tie_word_embeddings=False,
        num_experts=64, num_experts_per_tok=8, norm_topk_prob=False, clip_qkv=None, rms_norm_eps=1e-5,
        rope_theta=10000.0, max_position_embeddings=4096, torch_dtype="bfloat16",
    ),
    "Qwen3-30B-A3B-8L": dict(
        architectures=["Qwen3MoeForCausalLM"], hidden_size=2048, intermediate_size=6144, num_hidden_layers=8,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
        tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
        rope_theta=1000000.0, max_position_embeddings=40960, torch_dtype="bfloat16",
    ),
}
# The same MoE layer shapes with fewer layers, to measure beside other jobs within ~4 GB (bf16): per layer
# the work is that of the full model; the LM head and embedding are a larger share of the bytes.
SHAPES["OLMoE-1B-7B-4L"] = {**SHAPES["OLMoE-1B-7B"], "num_hidden_layers": 4}  # 3.8 GB
SHAPES["Qwen3-30B-A3B-2L"] = {**SHAPES["Qwen3-30B-A3B-8L"], "num_hidden_layers": 2}  # 3.7 GB
"""Shape name -> the fields of its config.json that matter (random weights are built from them)."""


def shape_config(name: str) -> ModelConfig:
    """The `ModelConfig` of a named shape.

    Raises:
        SoloError: an unknown name (the message lists the known ones).
    """
    if name not in SHAPES:
        raise SoloError(f"unknown shape {name!r}; choose one of {', '.join(SHAPES)}")
    # Random weights time fixed lengths: no token id stops them (not the architecture's default EOS either).
    return ModelConfig.from_dict({"bos_token_id": None, "eos_token_id": None, **SHAPES[name]})


def shape_raw_config(name: str) -> dict[str, Any]:
    """The config.json-style dict of a named shape (for building peers such as transformers models).

    Raises:
        SoloError: an unknown name.
    """
    shape_config(name)
    return dict(SHAPES[name])


@torch.no_grad()
def build_model(config: ModelConfig, dtype: torch.dtype, seed: int = 0, std: float = 0.02,
                device: torch.device | str = "cpu") -> Transformer:
    """An eager `Transformer` with random weights, built directly on `device`.

    Matrices are N(0, std^2); norm weights are 1 (0 for unit-offset norms), biases N(0, std^2).

    Args:
        config: model config.
        dtype: weight dtype.
        seed: random seed (the same seed gives the same weights).
        std: standard deviation of the matrices.
        device: where the weights live.

    Returns:
        The model in eval mode, without gradients (a `solo.model.lanes.LaneTransformer` for a lane shape).
    """
    if config.lanes is not None:
        from solo.model.lanes import build_random_lane_model

        return build_random_lane_model(config, dtype, seed=seed, std=std, device=device)
    with torch.device("meta"):
        model = Transformer(config)
    model = model.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(0.0 if config.norm_unit_offset and ".q_norm" not in name and ".k_norm" not in name else 1.0)
        else:
            param.normal_(0.0, std, generator=gen)
    model.rotary = RotaryEmbedding(config).to(device)
    return model.eval().requires_grad_(False)


def shape_model_for_tokenizer(args: Any, tokenizer_folder: Path) -> tuple[Transformer, Any, torch.device]:  # noqa: ANN401
    """A random-weight model of the shape `args.shape` (quantized with `args.quantize`) and a tokenizer for it.

    The benches that feed text to a shape (`--agent`, `--structured`) need a tokenizer whose ids all fall
    inside the shape's vocabulary; only the token counts differ from the real model's.

    Args:
        args: parsed `solo bench` flags; reads shape, device, dtype, seed, quantize.
        tokenizer_folder: folder with the tokenizer files.

    Returns:
        (model in eval mode, `solo.tokenizer.Tokenizer`, the device the weights live on).

    Raises:
        SoloError: an unknown shape, or the tokenizer has more ids than the shape's vocabulary.
    """
    from solo.engine.engine import resolve_device
    from solo.model.hub import resolve_dtype
    from solo.tokenizer import Tokenizer

    device = resolve_device(args.device)
    config = shape_config(args.shape)
    tokenizer = Tokenizer.from_folder(tokenizer_folder)
    if tokenizer.vocab_size > config.vocab_size:
        raise SoloError(f"the tokenizer in {tokenizer_folder} has {tokenizer.vocab_size} ids, more than the "
                        f"{args.shape} shape's vocabulary of {config.vocab_size}; give that model's tokenizer")
    model = build_model(config, resolve_dtype(args.dtype, config.torch_dtype), seed=args.seed, device=device)
    if args.quantize:
        from solo.runtime.quant import quantize_model

        model = quantize_model(model, args.quantize)
    return model, tokenizer, device
