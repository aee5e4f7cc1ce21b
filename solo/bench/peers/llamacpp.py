"""llama.cpp (through llama-cpp-python) as a peer, on a GGUF file written from Solo's own weights.

The GGUF is written with the `gguf` package at the precision matching Solo's run: bf16 weights -> F16
(same bytes per weight; llama.cpp's best-tuned 16-bit CPU path), float32 -> F32, int8 -> Q8_0,
int4 -> Q4_0. Norms stay F32 as llama.cpp expects. Llama-family q/k rows are permuted from the
rotate-half RoPE layout to llama.cpp's interleaved one (Qwen2 uses the same rotate-half in both). The
vocabulary is a placeholder of the right size: the benchmark feeds token ids, never text.

Install with `pip install solo[llamacpp]`; llama-cpp-python builds llama.cpp from source.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np
import torch

from solo.bench.peers import PeerSkipped, PeerSpec, RunResult
from solo.model.config import ModelConfig
from solo.model.rope import rope_inv_freq
from solo.model.transformer import Transformer

_ARCHES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
_PERMUTED = {"llama"}  # llama.cpp applies interleaved RoPE to these: q/k rows must be permuted


def gguf_type_name(dtype: torch.dtype, quantize: str | None) -> str:
    """The GGUF weight type matching Solo's precision ("F16", "F32", "Q8_0", "Q4_0")."""
    if quantize == "int8":
        return "Q8_0"
    if quantize == "int4":
        return "Q4_0"
    return "F32" if dtype == torch.float32 else "F16"


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


def write_gguf(model: Transformer, path: Path, type_name: str) -> None:
    """Write `model` as a GGUF file llama.cpp can load.

    Raises:
        PeerSkipped: the gguf package is missing or the architecture has no GGUF mapping here.
    """
    try:
        import gguf
    except ImportError:
        raise PeerSkipped("the gguf package is not installed (pip install solo[llamacpp])") from None
    cfg: ModelConfig = model.config
    arch = _ARCHES.get(cfg.architecture)
    if arch is None or cfg.qk_norm or cfg.sandwich_norm:
        raise PeerSkipped(f"no GGUF conversion for {cfg.architecture} in the bench")
    qtype = gguf.GGMLQuantizationType[type_name]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope.theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7, "Q4_0": 2}[type_name])
    tokens, scores, types = _vocab(cfg.vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    def matrix(name: str, w: torch.Tensor) -> None:
        data = w.detach().float().numpy()
        if type_name == "F32":
            writer.add_tensor(name, data)
        elif type_name == "F16":
            writer.add_tensor(name, data.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    def vector(name: str, v: torch.Tensor) -> None:
        writer.add_tensor(name, v.detach().float().numpy())

    matrix("token_embd.weight", model.embed.weight)
    if cfg.rope.rope_type == "llama3":
        base = rope_inv_freq(type(cfg.rope)(theta=cfg.rope.theta), cfg.head_dim)
        vector("rope_freqs.weight", base / rope_inv_freq(cfg.rope, cfg.head_dim))
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.attn, layer.mlp
        q, k = attn.q_proj.weight, attn.k_proj.weight
        if arch in _PERMUTED:
            q, k = _permute_rope_rows(q, cfg.num_heads), _permute_rope_rows(k, cfg.num_kv_heads)
        vector(f"blk.{i}.attn_norm.weight", layer.attn_norm.weight)
        matrix(f"blk.{i}.attn_q.weight", q)
        matrix(f"blk.{i}.attn_k.weight", k)
        matrix(f"blk.{i}.attn_v.weight", attn.v_proj.weight)
        matrix(f"blk.{i}.attn_output.weight", attn.o_proj.weight)
        if cfg.qkv_bias:
            qb, kb = attn.q_proj.bias, attn.k_proj.bias
            if arch in _PERMUTED:
                qb = _permute_rope_rows(qb[:, None], cfg.num_heads)[:, 0]
                kb = _permute_rope_rows(kb[:, None], cfg.num_kv_heads)[:, 0]
            vector(f"blk.{i}.attn_q.bias", qb)
            vector(f"blk.{i}.attn_k.bias", kb)
            vector(f"blk.{i}.attn_v.bias", attn.v_proj.bias)
        vector(f"blk.{i}.ffn_norm.weight", layer.mlp_norm.weight)
        matrix(f"blk.{i}.ffn_gate.weight", mlp.gate_proj.weight)
        matrix(f"blk.{i}.ffn_up.weight", mlp.up_proj.weight)
        matrix(f"blk.{i}.ffn_down.weight", mlp.down_proj.weight)
    vector("output_norm.weight", model.norm.weight)
    if model.lm_head is not None:
        matrix("output.weight", model.lm_head.weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _available_memory_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


class LlamaCppPeer:
    """llama.cpp generating greedily on the same weights, one token per `eval` call.

    Args:
        spec: what to build; `spec.extra["cache_key"]` names the GGUF in the cache folder so repeated
            runs on the same weights reuse it.

    Raises:
        PeerSkipped: llama-cpp-python or gguf is missing, the architecture has no GGUF mapping, the
            device is not the CPU, or there is not enough memory for the conversion.
    """

    def __init__(self, spec: PeerSpec) -> None:
        # llama.cpp's OpenMP threads (LLVM libomp) otherwise spin for 200 ms after every token, stealing the
        # cores from the engine that runs next in the interleaved repeats; must be set before libomp loads.
        os.environ.setdefault("KMP_BLOCKTIME", "0")
        try:
            import llama_cpp
        except ImportError:
            raise PeerSkipped("llama-cpp-python is not installed (pip install solo[llamacpp])") from None
        if spec.device.type != "cpu":
            raise PeerSkipped("the llama.cpp peer runs on the CPU build only")
        self.name = "llama.cpp"
        type_name = gguf_type_name(spec.dtype, spec.quantize)
        from solo.runtime.cpu_build import cache_dir

        folder = cache_dir().parent / "gguf"
        folder.mkdir(parents=True, exist_ok=True)
        key = hashlib.sha256(f"{spec.extra.get('cache_key')}|{type_name}".encode()).hexdigest()[:16]
        path = folder / f"{key}-{type_name}.gguf"
        if not path.is_file() or spec.extra.get("cache_key") is None:
            params = sum(p.numel() for p in spec.model.parameters())
            if params * 4 > _available_memory_bytes():  # conversion holds a float32 copy per tensor and the output
                raise PeerSkipped(f"not enough free memory to convert {params / 1e9:.1f}B parameters to GGUF")
            tmp = path.with_suffix(".tmp")
            write_gguf(spec.model, tmp, type_name)
            os.replace(tmp, path)
        self.path = path
        self._llama_cpp = llama_cpp
        n_batch = max(512, min(spec.max_seq, 2048))
        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=spec.max_seq + 8, n_batch=n_batch, n_ubatch=n_batch,
            n_threads=spec.threads, n_threads_batch=spec.threads, logits_all=False, verbose=False,
        )
        self.n_vocab = self.llm.n_vocab()
        system = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
        self.build_info = f"llama-cpp-python {llama_cpp.__version__}, GGUF {type_name}, {system}"

    def _last_token(self) -> int:
        logits = self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return int(np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).argmax())

    def run(self, prompt_ids: list[int], gen_len: int) -> RunResult:
        """Greedy generation: prompt in one `eval`, then one `eval` per token."""
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(prompt_ids)
        token = self._last_token()
        first = time.perf_counter()
        for _ in range(gen_len - 1):
            self.llm.eval([token])
            token = self._last_token()
        end = time.perf_counter()
        return RunResult(ttft_s=first - start, decode_s=end - first, decode_tokens=gen_len - 1)

    def close(self) -> None:
        """Free llama.cpp's model and context (the GGUF stays cached)."""
        self.llm.close() if hasattr(self.llm, "close") else None
        self.llm = None
