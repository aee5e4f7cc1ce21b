"""transformers `generate` as a peer: eager PyTorch, and static cache + torch.compile.

The transformers model is built on the meta device from the same config and then pointed at Solo's own
weight tensors (shared, not copied), so both engines read the same bytes and the machine needs no second
copy of the weights. Names are mapped with Solo's one name table (`solo.model.weights.hf_to_solo_name`).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from solo.bench.peers import PeerSkipped, PeerSpec, RunResult
from solo.model.config import listed_architectures
from solo.model.moe import moe_tensor_target
from solo.model.weights import fused_parts, hf_to_solo_name, restore_rope_rows
from solo.runtime.cpu_packing import dense_named_tensors

_MODEL_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2", "MixtralForCausalLM": "mixtral",
                "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe", "OlmoeForCausalLM": "olmoe",
                "Phi3ForCausalLM": "phi3", "Gemma3ForCausalLM": "gemma3_text", "SmolLM3ForCausalLM": "smollm3"}


class _Clock:
    """A transformers streamer that timestamps every new token (the first call carries the prompt)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.times: list[float] = []

    def put(self, value: Any) -> None:  # noqa: ANN401
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _hf_config(raw: dict[str, Any], dtype: torch.dtype) -> Any:  # noqa: ANN401
    from transformers import AutoConfig

    fields = {k: v for k, v in raw.items() if k not in ("architectures", "torch_dtype", "dtype")}
    arch = (listed_architectures(raw) or [""])[0]
    model_type = raw.get("model_type") or _MODEL_TYPES.get(arch)
    if model_type is None:
        raise PeerSkipped(f"no transformers model type for {arch!r}")
    fields.pop("model_type", None)
    config = AutoConfig.for_model(model_type, **fields)
    config.architectures = [arch]
    return config


def _set_tensor(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name)
    owner._parameters[attr] = torch.nn.Parameter(tensor, requires_grad=False)


def hf_model_from_solo(solo_model: torch.nn.Module, raw_config: dict[str, Any], dtype: torch.dtype,
                       device: torch.device) -> Any:  # noqa: ANN401
    """A transformers causal LM that holds Solo's tensors (shared, not copied).

    Args:
        solo_model: a Solo `Transformer` (packed CPU matrices are unpacked, see `dense_named_tensors`).
        raw_config: its config.json fields.
        dtype: the weights' dtype.
        device: where Solo's tensors live (RoPE buffers are rebuilt there).

    Raises:
        PeerSkipped: transformers cannot build the architecture, or a parameter has no Solo tensor.
    """
    from transformers import AutoModelForCausalLM

    config = _hf_config(raw_config, dtype)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    except Exception as exc:  # noqa: BLE001 - any failure means the peer cannot run
        raise PeerSkipped(f"transformers cannot build this model ({exc})") from None
    solo_params = dense_named_tensors(solo_model)  # unpacked where the CPU runtime packed them for AMX
    for name, _ in model.named_parameters(remove_duplicate=False):
        parts = fused_parts(name, solo_model.config)
        if parts is not None:  # Phi-3's fused qkv_proj / gate_up_proj: one copy of Solo's parts, joined
            names = [hf_to_solo_name(part, solo_model.config) for part, _ in parts]
            if not all(n in solo_params for n in names):
                raise PeerSkipped(f"no Solo tensors for transformers parameter {name}")
            _set_tensor(model, name, torch.cat([restore_rope_rows(n, solo_params[n].detach(), solo_model.config)
                                                for n in names]))
            continue
        # transformers holds experts fused ([experts, ...]) in the same layout as Solo.
        target = moe_tensor_target(name, solo_model.config)
        solo_name = target.name if target is not None else hf_to_solo_name(name, solo_model.config)
        if solo_name is None and name == "lm_head.weight":
            solo_name = "embed.weight"
        if solo_name not in solo_params:
            raise PeerSkipped(f"no Solo tensor for transformers parameter {name}")
        # (partial rotary embeddings: q / k rows back in the checkpoint's order, a copy; see rope_row_order)
        _set_tensor(model, name, restore_rope_rows(solo_name, solo_params[solo_name].detach(), solo_model.config))
    # Buffers built on the meta device hold no values: rebuild them for real (RoPE tables, Gemma's embedding scale).
    for module in model.modules():
        meta = [name for name, b in module.named_buffers(recurse=False) if b.is_meta]
        if not meta:
            continue
        if type(module).__name__.endswith("RotaryEmbedding"):  # one table, or one per layer type (Gemma 3)
            module.__init__(config=getattr(module, "config", model.config))
            module.to(device)
        elif meta == ["embed_scale"] and hasattr(module, "scalar_embed_scale"):
            module.embed_scale = torch.tensor(module.scalar_embed_scale, device=device)
        else:
            raise PeerSkipped(f"cannot rebuild {type(module).__name__}'s buffers {meta} for transformers")
    return model


class HFPeer:
    """transformers generate on Solo's weights.

    Args:
        spec: what to build (see `PeerSpec`).
        compiled: use a static KV cache and torch.compile: on CUDA generate's own compile of the decode
            step (mode "reduce-overhead"), on the CPU the whole forward in the default inductor mode.

    Raises:
        PeerSkipped: transformers is missing, or the model cannot be built or compiled.
    """

    def __init__(self, spec: PeerSpec, compiled: bool) -> None:
        try:
            import transformers
            from transformers import GenerationConfig
        except ImportError:
            raise PeerSkipped("transformers is not installed (pip install transformers)") from None
        self.name = "hf-compile" if compiled else "hf-eager"
        self.device = spec.device
        model = hf_model_from_solo(spec.model, spec.raw_config, spec.dtype, spec.device)
        model.eval().requires_grad_(False)
        self.model = model
        self.generation_config = GenerationConfig(
            do_sample=False, eos_token_id=None, pad_token_id=0, bos_token_id=None,
        )
        mode = "eager (sdpa attention, dynamic cache)"
        if compiled:
            self.generation_config.cache_implementation = "static"
            if spec.device.type == "cuda":
                # transformers' own path: generate compiles the decode forward (mode "reduce-overhead",
                # CUDA graphs) and runs the prefill eager, so the static cache's tensors get their fixed
                # addresses. Compiling the whole forward by hand (prefill included) made every graph skip
                # CUDA graphs (mutated inputs) and then read overwritten graph outputs (transformers 5.17).
                self.generation_config.disable_compile = False
                mode = "static cache + generate's torch.compile(mode='reduce-overhead') of the decode step"
            else:
                self.generation_config.disable_compile = True  # compiled by hand below, once
                model.forward = torch.compile(model.forward, mode="default")
                mode = "static cache + torch.compile(mode='default')"
        torch.set_num_threads(spec.threads)
        self.build_info = f"transformers {transformers.__version__}, torch {torch.__version__}, {mode}, {spec.dtype}"

    @torch.inference_mode()
    def run(self, prompt_ids: list[int], gen_len: int) -> RunResult:
        """Greedy `generate` of `gen_len` tokens, timed through a streamer.

        On CUDA a streamer would force a host sync per token, so there TTFT is a 1-token `generate` and
        the decode time what a full one takes beyond it.
        """
        if self.device.type == "cuda":
            ttft_s = self._timed_generate(prompt_ids, 1)
            total_s = self._timed_generate(prompt_ids, gen_len)
            return RunResult(ttft_s=ttft_s, decode_s=max(total_s - ttft_s, 1e-9), decode_tokens=gen_len - 1)
        ids = torch.tensor([prompt_ids], device=self.device)
        clock = _Clock(self.device)
        self.generation_config.max_new_tokens = gen_len
        self.generation_config.min_new_tokens = gen_len
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        try:
            self.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=self.generation_config,
                                streamer=clock)
        except Exception as exc:  # noqa: BLE001 - e.g. an inductor failure on first use
            raise PeerSkipped(f"{self.name} failed: {str(exc).splitlines()[0][:300]}") from None
        tokens = clock.times[1:]  # times[0] is the prompt
        return RunResult(ttft_s=tokens[0] - start, decode_s=tokens[-1] - tokens[0], decode_tokens=len(tokens) - 1)

    def _timed_generate(self, prompt_ids: list[int], gen_len: int) -> float:
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        made = len(self.generate(prompt_ids, gen_len))
        torch.cuda.synchronize(self.device)
        if made != gen_len:
            raise PeerSkipped(f"{self.name} made {made} tokens, not {gen_len}")
        return time.perf_counter() - start

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], gen_len: int) -> list[int]:
        """The `gen_len` greedy token ids transformers picks after `prompt_ids` (the bench's token check)."""
        ids = torch.tensor([prompt_ids], device=self.device)
        self.generation_config.max_new_tokens = gen_len
        self.generation_config.min_new_tokens = gen_len
        try:
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                      generation_config=self.generation_config)
        except Exception as exc:  # noqa: BLE001 - e.g. an inductor failure on first use
            raise PeerSkipped(f"{self.name} failed: {str(exc).splitlines()[0][:300]}") from None
        return out[0, len(prompt_ids):].tolist()  # one device-to-host copy

    def close(self) -> None:
        """Drop the model (Solo's shared tensors stay alive)."""
        self.model = None
