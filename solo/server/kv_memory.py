"""KV-cache memory: bytes per token, the memory a device has free, and how many tokens per slot fit.

The server's KV cache is static: `--max-batch` rows of `--max-model-len` tokens, allocated once at start-up
(`DecodeRuntime.reserve`). So memory is checked once, before that allocation: a cache that cannot fit is
refused with the numbers and the fix instead of failing inside the allocator (or being killed by the
kernel's OOM killer later, when the pages are first written). Without `--max-model-len` the slot length is
lowered to what fits, and a request longer than that gets a 400 saying the limit comes from memory.
"""

from __future__ import annotations

import torch

from solo.memory import host_memory
from solo.model.config import ModelConfig

KV_MEMORY_FRACTION = 0.9
"""Share of the free memory the KV cache may take at start-up (the rest: activations, the HTTP side, and
other processes; vLLM's --gpu-memory-utilization plays the same role)."""

HEADROOM_BYTES = 32 << 20
"""Memory the KV cache and the prefix store leave for what the server grows into under load (threads, buffers,
Python's heap) before KV_MEMORY_FRACTION applies: 10% of a container's last tens of MB was too little (12
concurrent long prompts to the bundled model under a 400 MB limit took about 10 MiB more)."""

AUTO_SLOTS = (8, 32)
"""Fewest and most KV-cache slots `--max-batch auto` (the default) gives."""

AUTO_SLOTS_MEMORY_FRACTION = 0.25
"""Share of the free memory the slots beyond the first AUTO_SLOTS[0] may take under `--max-batch auto`."""

MIN_SLOT_TOKENS = 16
"""A slot shorter than this is not worth serving: the server refuses to start instead."""


def kv_bytes_per_token(config: ModelConfig, element_bytes: int, kv_heads: int | None = None) -> int:
    """Bytes of KV cache one token takes in one sequence: keys and values of every layer.

    Args:
        config: the model config (num_layers, num_kv_heads, head_dim).
        element_bytes: bytes per cache element (2 for bfloat16/float16, 4 for float32).
        kv_heads: KV heads held per layer, where a runtime holds another count than the model's (a
            tensor-parallel one: its `kv_heads_in_memory`); default `config.num_kv_heads`.

    Returns:
        2 * num_layers * kv_heads * head_dim * element_bytes.
    """
    heads = config.num_kv_heads if kv_heads is None else kv_heads
    return 2 * config.num_layers * heads * config.head_dim * element_bytes


def runtime_kv_bytes_per_token(runtime: object) -> int:
    """`kv_bytes_per_token` of a runtime's cache: its element size and its `kv_heads_in_memory` where it has one.

    A tensor-parallel runtime declares the KV heads in the memory the server checks (`TPRuntime`).
    """
    return kv_bytes_per_token(runtime.config, cache_element_bytes(runtime),  # type: ignore[attr-defined]
                              getattr(runtime, "kv_heads_in_memory", None))


def cache_element_bytes(runtime: object, default_dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes per element of a runtime's KV cache (the model's weight dtype for every Solo runtime).

    Args:
        runtime: a `DecodeRuntime`; its `model.dtype` (or an allocated `cache`) is read when present.
        default_dtype: assumed when the runtime exposes neither.
    """
    cache = getattr(runtime, "cache", None)
    if cache is not None and getattr(cache, "k", None):
        return cache.k[0].element_size()
    model = getattr(runtime, "model", None)
    dtype = getattr(model, "dtype", None)
    return torch.empty((), dtype=dtype if isinstance(dtype, torch.dtype) else default_dtype).element_size()


def available_memory_bytes(device: torch.device | str) -> int | None:
    """Memory free for new allocations on `device`, in bytes, or None when it cannot be read.

    CPU: `solo.memory.host_memory` (`MemAvailable` of /proc/meminfo, within a container's cgroup limit), the
    figure every host KV cache checks itself against. CUDA: `torch.cuda.mem_get_info`.
    """
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    return host_memory().available_bytes


def gib(nbytes: float) -> str:
    """Bytes as GiB with two decimals ("1.25 GiB")."""
    return f"{nbytes / 2**30:.2f} GiB"


def auto_slots(slot_tokens: int, bytes_per_token: int, free_bytes: int | None) -> int:
    """KV-cache slots for `--max-batch auto`: the full-length slots a quarter of free memory holds, 8 to 32.

    Slots are what lets a request start at once instead of queueing for another to finish (its TTFT);
    compute is shared by the batched decode step whatever the slot count, and an idle slot costs only its
    memory. So slots are given generously where they are cheap (the bundled model: 32 slots of 2048 tokens
    = 256 MiB) and fewer where a slot is large (a 32k-token slot of Qwen2.5-0.5B is 384 MiB: 13 slots with
    20 GB free); never fewer than 8 (Llama 3.1 8B's 128k-token slot is 16 GiB: there the slot length
    shrinks to fit instead, see `fit_slot_tokens`).

    Args:
        slot_tokens: tokens per slot (--max-model-len or the model's context).
        bytes_per_token: see `kv_bytes_per_token`.
        free_bytes: free memory, or None when unknown (then the fewest, 8).

    Returns:
        A slot count in [AUTO_SLOTS[0], AUTO_SLOTS[1]].
    """
    low, high = AUTO_SLOTS
    if free_bytes is None or slot_tokens <= 0 or bytes_per_token <= 0:
        return low
    fits = int(free_bytes * AUTO_SLOTS_MEMORY_FRACTION) // (slot_tokens * bytes_per_token)
    return max(low, min(high, fits))


def fit_slot_tokens(rows: int, wanted_tokens: int, bytes_per_token: int, free_bytes: int | None) -> int:
    """Tokens per slot that fit `rows` slots in `KV_MEMORY_FRACTION` of `free_bytes` (at most `wanted_tokens`).

    Args:
        rows: KV-cache slots (--max-batch).
        wanted_tokens: the slot length asked for.
        bytes_per_token: see `kv_bytes_per_token`.
        free_bytes: free memory, or None when unknown (then `wanted_tokens` is taken as fitting).

    Returns:
        `wanted_tokens` when it fits, else the largest multiple of 16 tokens that does (possibly 0).
    """
    if free_bytes is None:
        return wanted_tokens
    budget = int(free_bytes * KV_MEMORY_FRACTION)
    if rows * wanted_tokens * bytes_per_token <= budget:
        return wanted_tokens
    return (budget // (rows * bytes_per_token)) // 16 * 16
