"""Write a tiny Hugging Face Llama folder as a GGUF file, the way llama.cpp's convert_hf_to_gguf.py lays it out.

Metadata keys, tensor names, the q/k row permutation and the tokenizer fields (a GPT-2 style BPE vocabulary,
merges, special token ids, chat template) follow llama.cpp's converter; the writing is the `gguf` package's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

_FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "BF16": 32}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp's converter interleaves the two rotated halves of each head's rows (HF keeps them apart).
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf_from_hf(folder: Path, path: Path, type_name: str, tokenizer: bool = True,
                       metadata: Callable[[Any], None] | None = None, spm: Path | None = None) -> Path:
    """Convert the tiny Llama, Qwen3, Phi-3 or Gemma 3 checkpoint in `folder` to `path` with matrices of `type_name`.

    The tokenizer is the folder's (GPT-2 style BPE), or with `spm` the SentencePiece model `spm`/tokenizer.model
    as llama.cpp writes one ("llama": tokens, scores, types; ids 1 and 2 BOS and EOS). Qwen3 as Qwen3Model
    writes it: no q/k row permutation, the q/k norms as attn_q_norm / attn_k_norm, the head size as key_length.

    Phi-3 as llama.cpp's Phi3MiniModel writes it: fused attn_qkv and ffn_up (gate then up), no q/k row
    permutation (NeoX RoPE), the sliding window (0: none), and LongRoPE's original context, attention factor
    and rope_factors_long / rope_factors_short tensors. Gemma 3 as Gemma3Model writes it: no permutation,
    every norm stored as 1 + w, the sandwich norms as post_attention_norm / post_ffw_norm, the sliding window,
    the global layers' linear RoPE scaling as rope.scaling.type / factor. A Llama or Qwen3 checkpoint's RoPE
    scaling as llama.cpp writes it: linear and YaRN as rope.scaling.* keys, Llama 3's as the tensor rope_freqs
    (one factor per frequency). `metadata(writer)` adds keys of a test's own before the file is written."""
    import gguf
    from gguf.quants import quantize
    from gguf.vocab import BpeVocab, SpecialVocab

    cfg = json.loads((folder / "config.json").read_text())
    tensors = {k: v.float().numpy() for k, v in load_file(folder / "model.safetensors").items()}
    phi3, gemma3, qwen3 = cfg["model_type"] == "phi3", cfg["model_type"] == "gemma3_text", cfg["model_type"] == "qwen3"
    arch = "phi3" if phi3 else "gemma3" if gemma3 else "qwen3" if qwen3 else "llama"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(int(head_dim * (cfg.get("partial_rotary_factor") or 1.0)))  # Phi-4-mini: 3/4
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if gemma3 or qwen3:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if gemma3:
        rope = rope["full_attention"]  # the global layers' (llama.cpp fixes the sliding layers' theta at 10000)
        writer.add_sliding_window(cfg["sliding_window"])
        if rope.get("rope_type") == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_freq_base(float(cfg.get("rope_theta") or rope.get("rope_theta", 1e4)))
    llama3_factors = None
    if arch in ("llama", "qwen3"):  # as TextModel.set_gguf_parameters and LlamaModel.generate_extra_tensors
        if rope.get("rope_type") == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["factor"])
        elif rope.get("rope_type") == "yarn":
            writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            writer.add_rope_scaling_factor(rope["factor"])
            if "original_max_position_embeddings" in rope:  # (files without it exist: llama.cpp takes the context)
                writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
            for key, add in (("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
                             ("beta_slow", writer.add_rope_scaling_yarn_beta_slow),
                             ("attention_factor", writer.add_rope_scaling_yarn_attn_factor)):
                if key in rope:
                    add(rope[key])
        elif rope.get("rope_type") == "llama3":  # no keys: one factor per frequency, the tensor rope_freqs
            from solo.model.gguf import llama3_rope_factors

            theta = rope.get("rope_theta", 1e4)
            inv_freq = (1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)).tolist()
            llama3_factors = llama3_rope_factors([2 * math.pi / f for f in inv_freq], rope["factor"],
                                                 rope["low_freq_factor"], rope["high_freq_factor"],
                                                 rope["original_max_position_embeddings"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_file_type(_FILE_TYPE[type_name])
    if phi3:
        writer.add_sliding_window(cfg.get("sliding_window") or 0)
        if rope.get("rope_type") == "longrope":
            original = cfg["original_max_position_embeddings"]
            writer.add_rope_scaling_orig_ctx_len(original)
            scale = cfg["max_position_embeddings"] / original
            writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))

    if spm is not None:
        from gguf.vocab import SentencePieceVocab

        texts, scores, kinds = zip(*SentencePieceVocab(spm).all_tokens(), strict=True)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(list(texts))
        writer.add_token_scores(list(scores))
        writer.add_token_types(list(kinds))
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_add_bos_token(True)
        tokenizer = False
    vocab = BpeVocab(folder)
    tokens = [text for text, _, _ in vocab.all_tokens()]
    # As convert_hf_to_gguf.py: added tokens are CONTROL when special, else USER_DEFINED; the rest NORMAL.
    added = {t["content"]: t for t in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]}
    types = [(gguf.TokenType.CONTROL if added[t]["special"] else gguf.TokenType.USER_DEFINED) if t in added
             else gguf.TokenType.NORMAL for t in tokens]
    if tokenizer:  # (False: a file without one, which Solo refuses)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        special = SpecialVocab(folder, load_merges=True)
        special.add_to_gguf(writer)

    qtype = gguf.GGMLQuantizationType[type_name]

    def matrix(name: str, w: np.ndarray) -> None:
        if type_name == "F32":
            writer.add_tensor(name, w.astype(np.float32))
        elif type_name == "F16":
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(w.astype(np.float32), qtype), raw_dtype=qtype)

    def vector(name: str, v: np.ndarray) -> None:
        writer.add_tensor(name, v.astype(np.float32) + (1.0 if gemma3 and name.endswith("norm.weight") else 0.0))

    matrix("token_embd.weight", tensors["model.embed_tokens.weight"])
    if llama3_factors is not None:
        vector("rope_freqs.weight", np.array(llama3_factors))
    if phi3 and rope.get("rope_type") == "longrope":
        vector("rope_factors_long.weight", np.array(rope["long_factor"]))
        vector("rope_factors_short.weight", np.array(rope["short_factor"]))
    # llama.cpp's norm names -> transformers' (Gemma 3: q/k norms and the sandwich norms)
    norms = [("ffn_norm", "post_attention_layernorm")]
    if qwen3:
        norms += [("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm")]
    if gemma3:
        norms = [("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm"),
                 ("post_attention_norm", "post_attention_layernorm"), ("ffn_norm", "pre_feedforward_layernorm"),
                 ("post_ffw_norm", "post_feedforward_layernorm")]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        vector(f"blk.{i}.attn_norm.weight", tensors[p + "input_layernorm.weight"])
        if phi3:
            matrix(f"blk.{i}.attn_qkv.weight", tensors[p + "self_attn.qkv_proj.weight"])
            matrix(f"blk.{i}.attn_output.weight", tensors[p + "self_attn.o_proj.weight"])
            vector(f"blk.{i}.ffn_norm.weight", tensors[p + "post_attention_layernorm.weight"])
            matrix(f"blk.{i}.ffn_up.weight", tensors[p + "mlp.gate_up_proj.weight"])
            matrix(f"blk.{i}.ffn_down.weight", tensors[p + "mlp.down_proj.weight"])
            continue
        q, k = tensors[p + "self_attn.q_proj.weight"], tensors[p + "self_attn.k_proj.weight"]
        matrix(f"blk.{i}.attn_q.weight", q if gemma3 or qwen3 else _permute(q, heads))
        matrix(f"blk.{i}.attn_k.weight", k if gemma3 or qwen3 else _permute(k, kv_heads))
        matrix(f"blk.{i}.attn_v.weight", tensors[p + "self_attn.v_proj.weight"])
        matrix(f"blk.{i}.attn_output.weight", tensors[p + "self_attn.o_proj.weight"])
        for ours, theirs in norms:
            vector(f"blk.{i}.{ours}.weight", tensors[f"{p}{theirs}.weight"])
        matrix(f"blk.{i}.ffn_gate.weight", tensors[p + "mlp.gate_proj.weight"])
        matrix(f"blk.{i}.ffn_up.weight", tensors[p + "mlp.up_proj.weight"])
        matrix(f"blk.{i}.ffn_down.weight", tensors[p + "mlp.down_proj.weight"])
    vector("output_norm.weight", tensors["model.norm.weight"])
    if "lm_head.weight" in tensors:
        matrix("output.weight", tensors["lm_head.weight"])
    if metadata is not None:
        metadata(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _ = torch
    return path
