"""llama.cpp (through llama-cpp-python) as a peer, on a GGUF file written from Solo's own weights.

The GGUF is written with the `gguf` package at the precision matching Solo's run: bf16 weights -> both F16 and
BF16 (same bytes per weight; the bench reports llama.cpp's better of the two, since which of its 16-bit CPU
paths is faster depends on the CPU), float32 -> F32, int8 -> Q8_0, int4 -> Q4_0. Norms stay F32 as llama.cpp
expects. Llama-family q/k rows (Llama, Mistral, Mixtral) are permuted from the rotate-half RoPE layout to
llama.cpp's interleaved one (Qwen2/3, Qwen3-MoE, OLMoE, Phi-3 and Gemma 3 use the same rotate-half in both).
Mixture-of-experts models (Mixtral, Qwen3-MoE, OLMoE) keep their experts stacked as llama.cpp reads them (see
`write_gguf`).
The vocabulary is a placeholder of the right size: the benchmark feeds token ids, never text.

The conversion runs in the bench's process (and is cached); llama.cpp itself runs in a worker process
(`llamacpp_worker.py`) with its default settings, as its users run it. Install with
`pip install llama-cpp-python gguf` (the `llamacpp` extra); llama-cpp-python builds llama.cpp from source.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from solo.bench.peers import PeerSkipped, PeerSpec, RunResult
from solo.memory import host_memory
from solo.model.config import ModelConfig
from solo.model.gguf import gemma3_query_pre_attn_scalar
from solo.model.moe import SparseMoeBlock
from solo.model.rope import rope_inv_freq
from solo.model.transformer import Transformer
from solo.model.weights import restore_rope_rows

_ARCHES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
           "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "llama", "Qwen3MoeForCausalLM": "qwen3moe",
           "OlmoeForCausalLM": "olmoe", "Phi3ForCausalLM": "phi3", "Gemma3ForCausalLM": "gemma3",
           "SmolLM3ForCausalLM": "smollm3"}
_PERMUTED = {"llama", "smollm3"}  # llama.cpp applies interleaved RoPE to these: q/k rows must be permuted
_MOE_NORM_TOPK = {"olmoe": False, "qwen3moe": True}  # llama.cpp's fixed choice per MoE family (Mixtral: True)

_INSTALL_HINT = '(pip install llama-cpp-python gguf; from a checkout: pip install -e ".[llamacpp]")'


def gguf_type_names(dtype: torch.dtype, quantize: str | None) -> list[str]:
    """The GGUF weight types matching Solo's precision, one llama.cpp peer each.

    bf16 weights give ["F16", "BF16"] (llama.cpp's two 16-bit paths; F16 holds every bf16 weight of a normal
    model's range exactly), float32 ["F32"], int8 ["Q8_0"], int4 ["Q4_0"].
    """
    if quantize == "int8":
        return ["Q8_0"]
    if quantize == "int4":
        return ["Q4_0"]
    return ["F32"] if dtype == torch.float32 else ["F16", "BF16"]


FORMAT_NOTES = {
    "Q8_0": "Solo int8 keeps one float32 scale per output row (8.0 bits per weight); llama.cpp Q8_0 keeps an f16 "
            "scale per block of 32 weights (8.5 bits per weight), so it reads 6% more bytes per token; both "
            "quantize the activations to int8 per block of 32 for integer dot products (Solo's scale float32, "
            "Q8_0's f16; Solo with SOLO_CPU_INT_DOT=0: float activations)",
    "Q4_0": "Solo int4 and llama.cpp Q4_0 both keep one 16-bit scale per block of 32 weights (4.5 bits per "
            "weight; Solo's scale is bf16 with a least-squares clip, Q4_0's is f16); both quantize the "
            "activations to int8 per block of 32 for integer dot products (Solo with SOLO_CPU_INT_DOT=0: float)",
}
"""How each quantized GGUF format differs from Solo's format of the same width (printed by the bench)."""


def _permute_rope_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    # Row order within each head: HF keeps the two rotated halves apart, llama.cpp interleaves them.
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def _vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    tokens, types = ["<unk>", "<s>", "</s>"], [2, 3, 3]
    tokens += [f"<0x{i:02X}>" for i in range(256)]
    types += [6] * 256
    tokens += [f"t{i}" for i in range(len(tokens), size)]
    types += [1] * (size - len(types))
    return tokens[:size], [0.0] * size, types[:size]


@dataclass
class _Entry:
    """One GGUF tensor: its name, its source tensor (numpy layout), and the GGUF type it is written as.

    A tuple of sources is written as their concatenation along the rows (Phi-3's fused q/k/v and gate/up),
    joined only while that tensor is written.
    """

    name: str
    source: torch.Tensor | tuple[torch.Tensor, ...]
    type_name: str

    def tensor(self) -> torch.Tensor:
        """The source (joined when it is a tuple)."""
        return torch.cat(self.source) if isinstance(self.source, tuple) else self.source

    @property
    def shape(self) -> list[int]:
        """The written tensor's shape, without joining."""
        if isinstance(self.source, tuple):
            return [sum(t.shape[0] for t in self.source), *self.source[0].shape[1:]]
        return list(self.source.shape)


def _check_gguf_support(cfg: ModelConfig) -> str:
    """The llama.cpp architecture name for `cfg`, or PeerSkipped naming what this writer cannot carry over."""
    arch = _ARCHES.get(cfg.architecture)
    if arch is None or (cfg.sandwich_norm and arch != "gemma3"):
        raise PeerSkipped(f"no GGUF conversion for {cfg.architecture} in the bench")
    # What this writer does not carry over would make llama.cpp run a different model: refuse instead.
    qk_norm = {"olmoe": "full", "qwen3": "head", "qwen3moe": "head", "gemma3": "head"}.get(arch)
    local_rope = cfg.layer_ropes[0] if cfg.layer_ropes else cfg.rope  # gemma3: layer 0 slides
    moe = arch in _MOE_NORM_TOPK or (arch == "llama" and cfg.is_moe)
    windows = set(cfg.layer_sliding_windows)
    unsupported = [name for name, present in [
        # phi3 has one window for every layer (llama.cpp's phi3.attention.sliding_window).
        ("a sliding window", windows != {None} and not (arch == "phi3" and len(windows) == 1) and arch != "gemma3"),
        (f"{cfg.rope.rope_type} RoPE scaling", cfg.rope.rope_type not in ("default", "llama3")
         and not (arch == "phi3" and cfg.rope.rope_type == "longrope")
         and not (arch == "gemma3" and cfg.rope.rope_type == "linear")),
        # llama.cpp's gemma3 hard-codes five sliding layers then a global one, the sliding layers' RoPE theta
        # (10000) and the query scale (1 / sqrt(head_dim); hidden / heads for its 62-layer 27B).
        ("a sliding-window pattern other than llama.cpp's (5 sliding, 1 global)", arch == "gemma3"
         and [w is None for w in cfg.layer_sliding_windows] != [(i + 1) % 6 == 0 for i in range(cfg.num_layers)]),
        ("a sliding-layer RoPE other than theta 10000", arch == "gemma3" and cfg.layer_ropes
         and local_rope != type(cfg.rope)(theta=10000.0)),
        ("a query_pre_attn_scalar other than llama.cpp's", arch == "gemma3"
         and cfg.attn_scale != gemma3_query_pre_attn_scalar(cfg.num_layers, cfg.hidden_size, cfg.num_heads,
                                                             cfg.head_dim) ** -0.5),
        # llama.cpp's smollm3 hard-codes a NoPE layer every fourth one.
        ("NoPE layers other than every fourth", arch == "smollm3" and [cfg.layer_uses_rope(i) for i in range(
            cfg.num_layers)] != [(i + 1) % 4 != 0 for i in range(cfg.num_layers)]),
        ("per-layer RoPE", cfg.layer_ropes and arch not in ("gemma3", "smollm3")),
        ("o_proj / MLP biases", cfg.o_bias or cfg.mlp_bias),
        (f"the {cfg.hidden_act} activation", cfg.hidden_act != ("gelu_pytorch_tanh" if arch == "gemma3" else "silu")),
        ("logit soft-capping", cfg.attn_logit_softcap is not None or cfg.final_logit_softcap is not None),
        ("q/k norms", cfg.qk_norm != (qk_norm is not None)
         or (cfg.qk_norm and cfg.qk_norm_full_width != (qk_norm == "full"))),
        # llama.cpp's olmoe sizes the k norm as the hidden size, so K must be as wide as Q.
        ("grouped-query attention with full-width q/k norms", qk_norm == "full" and cfg.num_kv_heads != cfg.num_heads),
        ("a mixture-of-experts MLP", cfg.is_moe and not moe),
        ("dense MLP layers between the expert layers", moe and not all(cfg.moe_layers)),
        ("a shared expert", cfg.shared_expert_intermediate_size > 0),
        # llama.cpp hard-codes each family's choice (olmoe: raw top-k probabilities; qwen3moe and Mixtral:
        # renormalized), so a checkpoint that chose otherwise would route differently there.
        (f"norm_topk_prob = {cfg.norm_topk_prob} (llama.cpp's {arch} assumes the opposite)",
         moe and cfg.norm_topk_prob != _MOE_NORM_TOPK.get(arch, True)),
    ] if present]
    if unsupported:
        raise PeerSkipped(f"the bench's GGUF writer does not carry {', '.join(unsupported)} over to llama.cpp "
                          f"({cfg.architecture})")
    return arch


def _gguf_entries(model: Transformer, arch: str, type_name: str) -> list[_Entry]:
    # Tensors in llama.cpp's names (gguf.constants.TENSOR_NAMES), numpy layout = [.., rows, cols]; ggml lists
    # the dimensions reversed, so a stacked expert tensor [experts, rows, cols] is ggml's {cols, rows, experts}.
    cfg: ModelConfig = model.config
    out: list[_Entry] = []

    def matrix(name: str, w: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
        out.append(_Entry(name, w, type_name))

    def vector(name: str, v: torch.Tensor) -> None:  # norms, biases, the router: F32 as llama.cpp keeps them
        out.append(_Entry(name, v, "F32"))

    def norm(name: str, w: torch.Tensor) -> None:  # Gemma's (1 + w) norms: llama.cpp stores 1 + w and scales by it
        vector(name, w.float() + 1.0 if cfg.norm_unit_offset else w)

    matrix("token_embd.weight", model.embed.weight)
    if cfg.rope.rope_type == "longrope":  # phi3: both factor sets; llama.cpp picks by its context size
        vector("rope_factors_long.weight", torch.tensor(cfg.rope.long_factor))
        vector("rope_factors_short.weight", torch.tensor(cfg.rope.short_factor))
    if cfg.rope.rope_type == "llama3":
        base = rope_inv_freq(type(cfg.rope)(theta=cfg.rope.theta), cfg.head_dim)
        vector("rope_freqs.weight", base / rope_inv_freq(cfg.rope, cfg.head_dim))
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.attn, layer.mlp
        # (Phi-4-mini's partial rotary: back to the checkpoint's row order, in which llama.cpp rotates them)
        q = restore_rope_rows(f"layers.{i}.attn.q_proj.weight", attn.q_proj.weight, cfg)
        k = restore_rope_rows(f"layers.{i}.attn.k_proj.weight", attn.k_proj.weight, cfg)
        if arch in _PERMUTED:
            q, k = _permute_rope_rows(q, cfg.num_heads), _permute_rope_rows(k, cfg.num_kv_heads)
        norm(f"blk.{i}.attn_norm.weight", layer.attn_norm.weight)
        if arch == "phi3":  # fused, as llama.cpp's phi3 reads them: q, k, v rows; gate then up rows
            matrix(f"blk.{i}.attn_qkv.weight", (q, k, attn.v_proj.weight))
            matrix(f"blk.{i}.attn_output.weight", attn.o_proj.weight)
            vector(f"blk.{i}.ffn_norm.weight", layer.mlp_norm.weight)
            matrix(f"blk.{i}.ffn_up.weight", (mlp.gate_proj.weight, mlp.up_proj.weight))
            matrix(f"blk.{i}.ffn_down.weight", mlp.down_proj.weight)
            continue
        matrix(f"blk.{i}.attn_q.weight", q)
        matrix(f"blk.{i}.attn_k.weight", k)
        matrix(f"blk.{i}.attn_v.weight", attn.v_proj.weight)
        matrix(f"blk.{i}.attn_output.weight", attn.o_proj.weight)
        if cfg.qk_norm:  # per head [head_dim] (Qwen3, Gemma 3) or over the whole projection (OLMoE)
            norm(f"blk.{i}.attn_q_norm.weight", attn.q_norm.weight)
            norm(f"blk.{i}.attn_k_norm.weight", attn.k_norm.weight)
        if cfg.sandwich_norm:  # Gemma 3: after attention, and after the MLP (below)
            norm(f"blk.{i}.post_attention_norm.weight", layer.attn_out_norm.weight)
        if cfg.qkv_bias:
            qb = restore_rope_rows(f"layers.{i}.attn.q_proj.bias", attn.q_proj.bias, cfg)
            kb = restore_rope_rows(f"layers.{i}.attn.k_proj.bias", attn.k_proj.bias, cfg)
            if arch in _PERMUTED:
                qb = _permute_rope_rows(qb[:, None], cfg.num_heads)[:, 0]
                kb = _permute_rope_rows(kb[:, None], cfg.num_kv_heads)[:, 0]
            vector(f"blk.{i}.attn_q.bias", qb)
            vector(f"blk.{i}.attn_k.bias", kb)
            vector(f"blk.{i}.attn_v.bias", attn.v_proj.bias)
        norm(f"blk.{i}.ffn_norm.weight", layer.mlp_norm.weight)
        if cfg.sandwich_norm:
            norm(f"blk.{i}.post_ffw_norm.weight", layer.mlp_out_norm.weight)
        if isinstance(mlp, SparseMoeBlock):
            inter = mlp.down_proj.shape[-1]
            vector(f"blk.{i}.ffn_gate_inp.weight", mlp.router.weight)  # [experts, hidden]
            matrix(f"blk.{i}.ffn_gate_exps.weight", mlp.gate_up_proj[:, :inter])  # [experts, inter, hidden]
            matrix(f"blk.{i}.ffn_up_exps.weight", mlp.gate_up_proj[:, inter:])
            matrix(f"blk.{i}.ffn_down_exps.weight", mlp.down_proj)  # [experts, hidden, inter]
        else:
            matrix(f"blk.{i}.ffn_gate.weight", mlp.gate_proj.weight)
            matrix(f"blk.{i}.ffn_up.weight", mlp.up_proj.weight)
            matrix(f"blk.{i}.ffn_down.weight", mlp.down_proj.weight)
    norm("output_norm.weight", model.norm.weight)
    if model.lm_head is not None:
        matrix("output.weight", model.lm_head.weight)
    elif arch in ("olmoe", "phi3"):  # olmoe has no tied head in llama.cpp (phi3: Phi-4-mini's tied one, written out)
        matrix("output.weight", model.embed.weight)
    return out


def _gguf_data(entry: _Entry) -> np.ndarray:
    # One tensor in its GGUF encoding (a float32 copy of it lives only while this runs).
    import gguf

    w = entry.tensor().detach()
    if entry.type_name == "BF16":  # the bf16 bits as they are (rounded to nearest even from float32)
        return w.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)
    data = w.float().contiguous().numpy()
    if entry.type_name == "F32":
        return data
    if entry.type_name == "F16":
        return data.astype(np.float16)
    return gguf.quants.quantize(data, gguf.GGMLQuantizationType[entry.type_name])


def _gguf_nbytes(entry: _Entry) -> tuple[list[int], np.dtype, int]:
    # (shape as add_tensor_info takes it, numpy dtype of `_gguf_data`, bytes) without converting the tensor.
    import gguf

    shape = entry.shape
    qtype = gguf.GGMLQuantizationType[entry.type_name]
    if entry.type_name in ("F32", "F16", "BF16"):
        dtype = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": np.dtype(np.uint16)}[entry.type_name]
        return shape, dtype, int(np.prod(shape)) * dtype.itemsize
    byte_shape = list(gguf.quant_shape_to_byte_shape(shape, qtype))
    return byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape))


def gguf_file_bytes(model: Transformer, type_name: str) -> int:
    """Bytes of the tensor data `write_gguf(model, ..., type_name)` writes (metadata not counted).

    Raises:
        PeerSkipped: as `write_gguf`.
    """
    arch = _check_gguf_support(model.config)
    return sum(_gguf_nbytes(e)[2] for e in _gguf_entries(model, arch, type_name))


def write_gguf(model: Transformer, path: Path, type_name: str) -> None:
    """Write `model` as a GGUF file llama.cpp can load, one tensor at a time.

    Architectures (llama.cpp's names): Llama and Mistral ("llama", q/k rows permuted to its interleaved
    RoPE), Qwen2 ("qwen2"), Qwen3 ("qwen3": per-head q/k norms), Mixtral ("llama" with `expert_count`,
    `expert_used_count` and stacked experts), Qwen3-MoE ("qwen3moe": `expert_feed_forward_length`) and OLMoE
    ("olmoe": q/k norms over the whole projection), Gemma 3 ("gemma3": per-head q/k norms, the sandwich norms
    as post_attention_norm / post_ffw_norm, every norm stored as 1 + w as llama.cpp's converter does, the
    sliding window and the global layers' linear RoPE scaling), SmolLM3 ("smollm3": Llama's layout; llama.cpp
    makes every fourth layer NoPE), Phi-3 ("phi3": fused attn_qkv and ffn_up, one sliding
    window, LongRoPE's factor tensors). An MoE layer's experts go out stacked as
    `ffn_gate_exps` / `ffn_up_exps` [experts, inter, hidden] and `ffn_down_exps` [experts, hidden, inter],
    its router as `ffn_gate_inp` [experts, hidden] in F32 (as llama.cpp's converter keeps it). The names and
    metadata keys follow the `gguf` package's constants and llama.cpp's model loader. Each tensor is
    converted and written before the next, so memory holds one float32 copy of the largest tensor.

    Args:
        model: Solo's eager model.
        path: the .gguf file to write.
        type_name: GGUF matrix type from `gguf_type_names` ("F32", "F16", "BF16", "Q8_0", "Q4_0").

    Raises:
        PeerSkipped: the gguf package is missing, or the architecture (or a feature of this config: a
            sliding window, linear/dynamic RoPE scaling, o_proj/MLP biases, a shared expert, dense layers
            between expert layers, a norm_topk_prob llama.cpp's family does not use, ...) has no GGUF
            mapping here.
    """
    try:
        import gguf
    except ImportError:
        raise PeerSkipped(f"the gguf package is not installed {_INSTALL_HINT}") from None
    cfg: ModelConfig = model.config
    arch = _check_gguf_support(cfg)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_layers)
    if cfg.is_moe:
        writer.add_expert_count(cfg.num_experts)
        writer.add_expert_used_count(cfg.num_experts_per_tok)
    if arch == "qwen3moe":  # its dense width and its experts' width are separate keys
        writer.add_feed_forward_length(cfg.intermediate_size)
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    else:  # Mixtral's and OLMoE's expert width is their feed_forward_length
        writer.add_feed_forward_length(cfg.moe_intermediate_size if cfg.is_moe else cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.rope_dim)  # Phi-4-mini: 96 of 128
    writer.add_rope_freq_base(cfg.rope.theta)
    if arch == "phi3":  # as llama.cpp's converter (Phi3MiniModel): 0 is no window
        writer.add_sliding_window(cfg.layer_sliding_windows[0] or 0)
        if cfg.rope.rope_type == "longrope":
            writer.add_rope_scaling_orig_ctx_len(cfg.rope.original_max_position_embeddings)
            writer.add_rope_scaling_attn_factors(cfg.rope.attention_factor)
    if arch == "gemma3":  # as Gemma3Model: the sliding layers' window, the global layers' RoPE scaling
        writer.add_sliding_window(cfg.layer_sliding_windows[0])
        if cfg.rope.rope_type == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(cfg.rope.factor)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type({"F32": 0, "F16": 1, "BF16": 32, "Q8_0": 7, "Q4_0": 2}[type_name])
    tokens, scores, types = _vocab(cfg.vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    entries = _gguf_entries(model, arch, type_name)
    for entry in entries:
        shape, dtype, nbytes = _gguf_nbytes(entry)
        raw = None if entry.type_name in ("F32", "F16") else gguf.GGMLQuantizationType[entry.type_name]
        writer.add_tensor_info(entry.name, shape, dtype, nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for entry in entries:
        writer.write_tensor_data(_gguf_data(entry))
    writer.close()


def check_llamacpp_peer(spec: PeerSpec, type_name: str | None = None) -> str:
    """The GGUF type a llama.cpp peer of `spec` would run (`type_name`, default the first that matches).

    Checks what needs neither the model nor a GGUF file, so that none is written for a peer that cannot run.

    Raises:
        PeerSkipped: llama-cpp-python is not installed, the device is not the CPU, or `type_name` is not one
            of `gguf_type_names(spec.dtype, spec.quantize)`.
    """
    # Only looked up, never imported: llama.cpp and its OpenMP runtime live in the worker process.
    if importlib.util.find_spec("llama_cpp") is None:
        raise PeerSkipped(f"llama-cpp-python is not installed {_INSTALL_HINT}")
    if spec.device.type != "cpu":
        raise PeerSkipped("the llama.cpp peer runs on the CPU build only")
    matching = gguf_type_names(spec.dtype, spec.quantize)
    type_name = type_name or matching[0]
    if type_name not in matching:
        raise PeerSkipped(f"GGUF {type_name} is not Solo's precision here ({str(spec.dtype).removeprefix('torch.')}"
                          f"{', ' + spec.quantize if spec.quantize else ''}); compare with "
                          f"{' or '.join('llama.cpp-' + t for t in matching)}")
    return type_name


def cached_gguf(spec: PeerSpec, type_name: str) -> Path:
    """The GGUF file of `spec.model` at `type_name`, written once into the cache (keyed by spec.extra["cache_key"]).

    `spec.model` may be None once the file is cached (`solo bench --peers-after-solo` frees Solo's weights
    before llama.cpp loads them).

    Raises:
        PeerSkipped: not enough memory or disk for the conversion, no model to convert, or `write_gguf`'s
            reasons.
    """
    from solo.runtime.cpu_build import cache_dir

    folder = cache_dir().parent / "gguf"
    folder.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(f"{spec.extra.get('cache_key')}|{type_name}".encode()).hexdigest()[:16]
    path = folder / f"{key}-{type_name}.gguf"
    if path.is_file() and spec.extra.get("cache_key") is not None:
        return path
    if spec.model is None:
        raise PeerSkipped(f"no GGUF {type_name} was written before Solo's weights were freed")
    # The conversion holds one tensor at a time: its float32 copy and its GGUF encoding.
    largest = max(p.numel() for p in spec.model.parameters())
    available = host_memory().available_bytes
    if available is not None and largest * 8 > available:
        raise PeerSkipped(f"not enough free memory to convert a tensor of {largest / 1e9:.1f}B parameters to GGUF")
    need = gguf_file_bytes(spec.model, type_name) + (64 << 20)
    free = shutil.disk_usage(folder).free
    if need > free:
        raise PeerSkipped(f"the GGUF file needs {need / 1e9:.1f} GB in {folder} but {free / 1e9:.1f} GB are free; "
                          "free disk space or delete old files there")
    tmp = path.with_suffix(".tmp")
    write_gguf(spec.model, tmp, type_name)
    os.replace(tmp, path)
    return path


def _worker_error(proc: subprocess.Popen[str], log: IO[bytes]) -> str:
    """Why the worker stopped: its exit status and the last line it wrote to stderr."""
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.seek(0)
    lines = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    return f"llama.cpp worker exited with status {proc.returncode}" + (f": {lines[-1][:300]}" if lines else "")


class LlamaCppPeer:
    """llama.cpp generating greedily on the same weights, one token per `eval` call, in its own process.

    The GGUF is written here (cached); a worker process (`llamacpp_worker.py`, started as a plain
    script) loads it once and times each generation. Out of process, llama.cpp keeps its default
    OpenMP behaviour, which is how its users run it (its threads spin-wait between tokens; turning
    that off in the bench's process cost it about a quarter of its decode speed), while its spinning
    threads can no longer share a process with Solo's. The bench pauses before every timed run so
    no engine's spin-waiting threads are left on the cores of the next (see `solo bench --pause-ms`).

    Args:
        spec: what to build; `spec.extra["cache_key"]` names the GGUF in the cache folder so repeated
            runs on the same weights reuse it.
        type_name: the GGUF weight type (one of `gguf_type_names(spec.dtype, spec.quantize)`; default its
            first). The peer is named "llama.cpp-<type_name>" in reports.

    Raises:
        PeerSkipped: llama-cpp-python or gguf is missing, the architecture has no GGUF mapping, the
            device is not the CPU, there is not enough memory for the conversion, or the worker
            failed to load the model.
    """

    def __init__(self, spec: PeerSpec, type_name: str | None = None) -> None:
        self._proc: subprocess.Popen[str] | None = None
        type_name = check_llamacpp_peer(spec, type_name)
        self.name = f"llama.cpp-{type_name}"
        self.type_name = type_name
        self.path = cached_gguf(spec, type_name)
        self._log = tempfile.TemporaryFile()  # the worker's stderr, quoted when it dies
        # -P: the script's folder stays off sys.path, so nothing of the solo package is imported there.
        self._proc = subprocess.Popen(
            [sys.executable, "-P", str(Path(__file__).with_name("llamacpp_worker.py"))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, encoding="utf-8",
        )
        n_batch = max(512, min(spec.max_seq, 2048))
        try:
            info = self._request({"op": "load", "path": str(self.path), "n_ctx": spec.max_seq + 8, "n_batch": n_batch,
                                  "threads": spec.threads})
        except PeerSkipped:
            self.close()
            raise
        self.n_vocab = int(info["n_vocab"])
        self.build_info = (f"llama-cpp-python {info['version']} in a worker process, GGUF {type_name}, "
                           f"{info['system_info']}")

    def _request(self, request: dict[str, Any]) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise PeerSkipped("llama.cpp worker is not running")
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self._proc = None
            raise PeerSkipped(_worker_error(proc, self._log))
        reply = json.loads(line)
        if "error" in reply:
            raise PeerSkipped(f"llama.cpp failed: {reply['error']}")
        return reply

    def run(self, prompt_ids: list[int], gen_len: int, reuse_prefix: bool = False) -> RunResult:
        """Greedy generation in the worker: prompt in one `eval`, then one `eval` per token.

        Times (seconds) are taken inside the worker, so the pipe's round trip is not counted.

        Args:
            prompt_ids: the prompt's token ids.
            gen_len: tokens to generate.
            reuse_prefix: keep the context's KV cache from the previous run and prefill only the prompt's
                tokens after the longest prefix they share (llama.cpp server's prompt cache; the agent
                bench uses it); otherwise a cold prefill.
        """
        reply = self._request({"op": "run", "prompt": list(prompt_ids), "gen_len": gen_len,
                               "reuse_prefix": reuse_prefix})
        return RunResult(ttft_s=reply["ttft_s"], decode_s=reply["decode_s"], decode_tokens=reply["decode_tokens"],
                         cached_tokens=int(reply.get("cached_tokens", 0)))

    def begin(self, prompt_ids: list[int], gen_len: int) -> float:
        """Cold prefill of `prompt_ids` and the first greedy token in the worker; TTFT in seconds.

        `gen_len` (the generation's length in all) is for the interface Solo's runner shares; the worker's
        context already holds the bench's longest prompt and generation.
        """
        return float(self._request({"op": "begin", "prompt": list(prompt_ids)})["ttft_s"])

    def advance(self, tokens: int) -> float:
        """Decode `tokens` more greedy tokens after `begin`; seconds, timed inside the worker."""
        return float(self._request({"op": "advance", "tokens": int(tokens)})["decode_s"])

    def generate(self, prompt_ids: list[int], gen_len: int) -> list[int]:
        """The `gen_len` greedy token ids llama.cpp picks after `prompt_ids` (for checking the conversion)."""
        return self._request({"op": "run", "prompt": list(prompt_ids), "gen_len": gen_len, "tokens": True})["tokens"]

    def peak_rss_bytes(self) -> int:
        """Peak resident memory of the worker process in bytes (0 when unknown or stopped)."""
        if self._proc is None:
            return 0
        try:
            for line in Path(f"/proc/{self._proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def close(self) -> None:
        """Stop the worker, freeing llama.cpp's model and context (the GGUF stays cached)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.communicate(json.dumps({"op": "quit"}) + "\n", timeout=10)
            except (subprocess.TimeoutExpired, BrokenPipeError, OSError, ValueError):
                proc.kill()
                proc.wait()
        if hasattr(self, "_log"):
            self._log.close()
