"""The CPU runtime's weight arenas: matrices on 2 MiB-aligned huge-page mappings, shared with the eager model."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import pytest
import torch
from checkpoints import make_checkpoint

from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime.cpu import CpuRuntime, cpu_unsupported_reason


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the /proc/self/smaps mapping that holds `address`."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    return []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_matrices_live_in_aligned_huge_page_arenas_shared_with_the_eager_model(tmp_path, dtype):
    folder = make_checkpoint(tmp_path / "qwen2", "qwen2", dtype=dtype, hidden_size=128, head_dim=32,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=352)
    model = load_weights(folder, ModelConfig.from_file(folder), dtype)
    reason = cpu_unsupported_reason(model)
    if reason is not None:
        pytest.skip(f"the native CPU runtime is not available here ({reason})")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    runtime = CpuRuntime(model)
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k, v in before.items():
        assert torch.equal(v, after[k]), k  # same values, wherever they live now
    first = runtime._layers[0]
    assert first.qkv.weight % (2 << 20) == 0  # each arena starts on a huge-page boundary
    def storage(module):  # the tensor an eager module reads (packed for the AMX kernels at the amx level)
        return getattr(module, "packed", None) if runtime.pack_amx else module.weight

    for i, layer in enumerate(model.layers):
        entry = runtime._layers[i]
        # The eager modules read the arena's copy (prefill and the eager fallback share one copy of the weights).
        assert storage(layer.attn.q_proj).data_ptr() == entry.qkv.weight
        assert storage(layer.attn.o_proj).data_ptr() == entry.o.weight
        assert storage(layer.mlp.gate_proj).data_ptr() == entry.gate_up.weight
        assert storage(layer.mlp.down_proj).data_ptr() == entry.down.weight
    if sys.platform.startswith("linux"):
        assert "hg" in _vm_flags(first.qkv.weight)  # advised for transparent huge pages (MADV_HUGEPAGE)
    # A second runtime over the same (already fused) model reads the first one's arenas (one copy of the
    # weights, not two) and matches it.
    ids, rows = torch.tensor([3]), torch.tensor([0])
    runtime.reserve(1, 8)
    again = CpuRuntime(model)
    again.reserve(1, 8)
    for i in range(len(model.layers)):
        for name in ("qkv", "o", "gate_up", "down"):
            assert getattr(again._layers[i], name).weight == getattr(runtime._layers[i], name).weight, (i, name)
    assert torch.equal(runtime.prefill(0, torch.tensor([1, 5, 9])), again.prefill(0, torch.tensor([1, 5, 9])))
    assert torch.equal(runtime.decode(rows, ids, torch.tensor([3])), again.decode(rows, ids, torch.tensor([3])))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
@pytest.mark.parametrize("arch, tied", [("qwen2", True), ("qwen2", False), ("qwen3_moe", False)],
                         ids=["tied", "untied", "moe"])
def test_no_weight_keeps_the_checkpoint_file_mapped(tmp_path, arch, tied):
    # From a break-test: load_weights leaves tensors it did not convert as views of the memory-mapped safetensors
    # file; after the runtime copied the matrices out, the norms and the embedding kept the whole mapping alive,
    # every page of it that the copies read resident (RSS: the arenas plus the whole file). A tied head streamed
    # the embedding from that file's 4 KiB pages every token.
    import gc

    from solo.runtime.cpu import _in_arena

    folder = make_checkpoint(tmp_path / arch, arch, dtype=torch.bfloat16, hidden_size=128, head_dim=32,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=352,
                             tie_word_embeddings=tied)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16)
    reason = cpu_unsupported_reason(model)
    if reason is not None:
        pytest.skip(f"the native CPU runtime is not available here ({reason})")
    weights = str((folder / "model.safetensors").resolve())
    assert weights in Path("/proc/self/maps").read_text()  # (the loaded model views the file)
    expected = model.forward_logits(torch.tensor([[1, 5, 9]]))[0, -1] if hasattr(model, "forward_logits") else None
    runtime = CpuRuntime(model)
    gc.collect()
    assert weights not in Path("/proc/self/maps").read_text()
    assert _in_arena(model.embed.weight) is tied  # the tied head streams the embedding from the arena
    assert runtime._struct.embed == model.embed.weight.data_ptr()
    runtime.reserve(1, 8)
    logits = runtime.prefill(0, torch.tensor([1, 5, 9]))
    assert torch.isfinite(logits).all() and (expected is None or torch.equal(logits, expected))


def test_arena_registry_forgets_freed_arenas():
    from solo.runtime.cpu import _LIVE_ARENAS, _huge_page_buffer, _in_arena

    buf = _huge_page_buffer(3 << 20)
    if not _LIVE_ARENAS:
        pytest.skip("no anonymous mappings on this platform: arenas are plain buffers")
    view = buf[4096:8192]
    assert _in_arena(view) and not _in_arena(torch.empty(16))
    base = buf.untyped_storage().data_ptr()
    del buf, view
    import gc

    gc.collect()
    assert base not in _LIVE_ARENAS  # a freed mapping's address may be reused by a plain allocation


def _small_bf16_model(tmp_path, native: bool = True):
    """A small bf16 Qwen2 checkpoint's eager model (skips without the native CPU runtime when `native`)."""
    folder = make_checkpoint(tmp_path / "qwen2", "qwen2", dtype=torch.bfloat16, hidden_size=128, head_dim=32,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=352)
    model = load_weights(folder, ModelConfig.from_file(folder), torch.bfloat16)
    reason = cpu_unsupported_reason(model)
    if native and reason is not None:
        pytest.skip(f"the native CPU runtime is not available here ({reason})")
    return model


def test_kv_cache_lives_zeroed_on_a_huge_page_mapping(tmp_path):
    model = _small_bf16_model(tmp_path)
    runtime = CpuRuntime(model)
    runtime.reserve(2, 2048)  # 2 MiB and more: a huge-page mapping
    cache = runtime.cache
    for i, (k, v) in enumerate(zip(cache.k, cache.v, strict=True)):
        assert k.shape == v.shape == (2, 2, 2048, 32) and k.dtype == torch.bfloat16
        assert not k.any() and not v.any()
        assert runtime._layers[i].k_cache == k.data_ptr() and runtime._layers[i].v_cache == v.data_ptr()
        assert k.data_ptr() % 4096 == 0 and v.data_ptr() % 4096 == 0
    if sys.platform.startswith("linux"):
        assert "hg" in _vm_flags(cache.k[0].data_ptr())  # advised before its first touch
    # A step writes the rows of its own position only, in its own layer's tensor.
    runtime.decode(torch.tensor([1]), torch.tensor([3]), torch.tensor([5]))
    for k in cache.k:
        assert k[1, :, 5].any() and not k[0].any() and not k[1, :, :5].any() and not k[1, :, 6:].any()
    small = CpuRuntime(model)
    small.reserve(1, 8)  # under one huge page: an ordinary zeroed allocation
    assert not small.cache.k[0].any() and small._layers[0].k_cache == small.cache.k[0].data_ptr()
    from solo.runtime.cpu import _in_arena

    assert _in_arena(cache.k[0]) == sys.platform.startswith("linux") and not _in_arena(small.cache.k[0])


def test_kv_cache_refuses_memory_it_cannot_use():
    from types import SimpleNamespace

    from solo.model.transformer import KVCache

    config = SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=16)  # what the cache reads of a config
    need = KVCache.buffer_bytes(config, 1, 8, torch.bfloat16)
    assert need == 4 * 4096  # 2 x layers tensors, each on its own 4 KiB page
    with pytest.raises(ValueError, match=f"at least {need} bytes"):
        KVCache(config, 1, 8, torch.bfloat16, allocate=lambda n: torch.empty(n - 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        KVCache(config, 1, 8, torch.bfloat16, allocate=lambda n: torch.empty(n, dtype=torch.float32))
    cache = KVCache(config, 1, 8, torch.bfloat16, allocate=lambda n: torch.full((n,), 7, dtype=torch.uint8))
    assert cache.nbytes() == 4 * 2 * 8 * 16 * 2 and all(not t.any() for t in cache.k + cache.v)


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOMEM, "Cannot allocate memory"),  # mmap
    RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 52428800000 bytes"),
    MemoryError(),
    RuntimeError("CUDA error: out of memory"),
])
def test_kv_cache_out_of_memory_is_a_clear_error(failure):
    from types import SimpleNamespace

    from solo.errors import KVCacheMemoryError
    from solo.model.transformer import KVCache

    def allocate(nbytes):
        raise failure

    config = SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=16)
    with pytest.raises(KVCacheMemoryError, match=r"out of memory for the KV cache of 3 sequence\(s\) x 4096 "
                                                 r"tokens \(3\.0 MiB\); ask for fewer tokens .*--max-batch"):
        KVCache(config, 3, 4096, torch.bfloat16, allocate=allocate)

    def broken(nbytes):
        raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="something else"):  # not an allocation failure: not renamed
        KVCache(config, 3, 4096, torch.bfloat16, allocate=broken)


def test_a_cache_that_does_not_fit_leaves_the_runtime_usable(tmp_path, monkeypatch):
    """A reservation that runs out of memory fails alone: the runtime keeps its sizes, and the next one that
    fits is allocated (it kept the failed sizes and failed every request after)."""
    from _decode_helpers import scarce_huge_pages

    from solo.errors import KVCacheMemoryError, SoloError
    from solo.runtime.eager import EagerRuntime

    model = _small_bf16_model(tmp_path)
    runtime = CpuRuntime(model)
    runtime.reserve(1, 8)
    expected = runtime.prefill(0, torch.tensor([1, 5, 9]))
    scarce_huge_pages(monkeypatch)
    with pytest.raises(KVCacheMemoryError, match="1000 sequence"):
        runtime.reserve(1000, 2048)
    assert (runtime.rows, runtime.max_seq, runtime.cache) == (1, 8, None)
    with pytest.raises(SoloError, match="prefill before reserve"):  # (the structs still point at the old cache)
        runtime.prefill(0, torch.tensor([1, 5, 9]))
    with pytest.raises(SoloError, match="reserve"):
        runtime.decode(torch.tensor([0]), torch.tensor([1]), torch.tensor([0]))
    runtime.reserve(1, 16)
    assert (runtime.rows, runtime.max_seq) == (1, 16)
    assert torch.equal(runtime.prefill(0, torch.tensor([1, 5, 9])), expected)

    eager = EagerRuntime(model)
    eager.reserve(1, 8)
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: (_ for _ in ()).throw(MemoryError()))
    with pytest.raises(KVCacheMemoryError):
        eager.reserve(1, 64)
    assert (eager.rows, eager.max_seq, eager.cache) == (1, 8, None)


@pytest.mark.parametrize("how", ["checked", "allocator"])
def test_rope_tables_that_do_not_fit_leave_the_runtime_usable(tmp_path, monkeypatch, how):
    """The RoPE tables grow with the context as the cache does and were outside its memory check; an allocator
    failure while building them escaped as a RuntimeError, and left the runtime's sizes updated and its tables
    empty, so every later request failed with an IndexError (a break test: an 8M-token context)."""
    import solo.runtime.cpu as cpu
    from solo.errors import KVCacheMemoryError
    from solo.memory import HostMemory

    model = _small_bf16_model(tmp_path)
    runtime = CpuRuntime(model)
    runtime.reserve(1, 8)
    expected = runtime.prefill(0, torch.tensor([1, 5, 9]))
    if how == "checked":
        monkeypatch.setattr(cpu, "host_memory", lambda: HostMemory(1000, "MemAvailable"))
        match = r"the RoPE tables of 64 positions need 0\.0 MiB beside the KV cache of 1 sequence\(s\) x 64 " \
                r"tokens, but 0\.0 MiB of memory is left \(MemAvailable\); ask for fewer tokens"
    else:
        def out_of_memory(*args, **kwargs):
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 512032768 bytes")

        monkeypatch.setattr(cpu, "_stack_tables", out_of_memory)
        match = "out of memory: the RoPE tables of 64 positions"
    with pytest.raises(KVCacheMemoryError, match=match):
        runtime.reserve(1, 64)
    assert (runtime.rows, runtime.max_seq, runtime.cache) == (1, 8, None)
    monkeypatch.undo()
    runtime.reserve(1, 8)  # allocates again (it returned early, and every step indexed the empty tables)
    assert torch.equal(runtime.prefill(0, torch.tensor([1, 5, 9])), expected)


def test_a_workspace_that_does_not_fit_leaves_the_runtime_usable(tmp_path, monkeypatch):
    """The step's workspace grows with the reserved context too: after a reservation that fitted, a workspace
    the allocator refused failed every later step with its RuntimeError (a verification round: 6M tokens)."""
    from solo.errors import KVCacheMemoryError

    model = _small_bf16_model(tmp_path)
    runtime = CpuRuntime(model)
    runtime.reserve(1, 8)
    expected = runtime.prefill(0, torch.tensor([1, 5, 9]))

    class HugeWorkspace:  # the library, but every workspace asked of it is 1 PiB
        def __init__(self, lib):
            self._lib = lib

        def __getattr__(self, name):
            if name == "solo_workspace_bytes":
                return lambda *args: 1 << 50
            return getattr(self._lib, name)

    monkeypatch.setattr(runtime, "_lib", HugeWorkspace(runtime._lib))
    with pytest.raises(KVCacheMemoryError, match="the decode step's workspace needs 1048576.00 GiB beside the KV "
                                                 "cache of 1 sequence"):
        runtime.reserve(1, 64)
    assert (runtime.rows, runtime.max_seq, runtime.cache) == (1, 8, None)
    monkeypatch.undo()
    runtime.reserve(1, 8)
    assert torch.equal(runtime.prefill(0, torch.tensor([1, 5, 9])), expected)
    monkeypatch.setattr(runtime, "_lib", HugeWorkspace(runtime._lib))  # a step's larger workspace: named too
    runtime._workspace = torch.empty(0, dtype=torch.uint8)
    with pytest.raises(KVCacheMemoryError, match="the decode step's workspace"):
        runtime.decode(torch.tensor([0]), torch.tensor([3]), torch.tensor([3]))


def test_rope_tables_built_in_blocks_are_the_whole_tables(tmp_path, monkeypatch):
    import solo.runtime.cpu as cpu

    model = _small_bf16_model(tmp_path)
    monkeypatch.setattr(cpu, "_ROPE_BLOCK", 5)
    runtime = CpuRuntime(model)
    runtime.reserve(1, 37)
    cos, sin = cpu._stack_tables(model.rotary.layer_tables(torch.arange(37).view(1, -1), model.dtype))
    assert torch.equal(runtime._cos, cos) and torch.equal(runtime._sin, sin)


def test_lane_rope_tables_that_do_not_fit_are_a_clear_error(monkeypatch):
    import solo.runtime.cpu as cpu
    from solo.errors import KVCacheMemoryError
    from solo.memory import HostMemory
    from solo.runtime.cpu_lanes import CpuLaneRuntime, cpu_lanes_unsupported_reason

    sys.path.insert(0, str(Path(__file__).parent))
    from test_cpu_lanes import CONFIGS, _model

    model = _model(dict(CONFIGS)["L4-d1"], torch.float32)
    if (reason := cpu_lanes_unsupported_reason(model)) is not None:
        pytest.skip(reason)
    runtime = CpuLaneRuntime(model)
    runtime.reserve(1, 8)
    monkeypatch.setattr(cpu, "host_memory", lambda: HostMemory(1000, "MemAvailable"))
    with pytest.raises(KVCacheMemoryError, match="the RoPE tables of 64 positions"):
        runtime.reserve(1, 64)
    assert (runtime.rows, runtime.max_seq, runtime.cache) == (1, 8, None)
    monkeypatch.undo()
    runtime.reserve(1, 8)
    assert runtime.cache is not None and runtime._cos.shape[0] == 8


def test_a_cache_beyond_the_available_memory_is_refused_before_allocating(tmp_path, monkeypatch):
    """Linux overcommits: the mapping would succeed and the OOM killer end the process at the first writes."""
    import solo.memory as memory
    from solo.errors import KVCacheMemoryError
    from solo.runtime.eager import EagerRuntime

    model = _small_bf16_model(tmp_path, native=False)
    runtimes = [EagerRuntime(model)]
    if cpu_unsupported_reason(model) is None:
        runtimes.append(CpuRuntime(model))
    from solo.model.transformer import KVCache

    row = KVCache.buffer_bytes(model.config, 1, 1024, torch.bfloat16)  # one sequence of 1024 tokens
    monkeypatch.setattr(memory, "meminfo_available_bytes", lambda: 5 * row // 2)
    monkeypatch.setattr(memory, "cgroup_room_bytes", lambda: None)
    for runtime in runtimes:
        runtime.reserve(1, 1024)
        with pytest.raises(KVCacheMemoryError, match=rf"of 4 sequence\(s\) x 1024 tokens needs {4 * row / 2**20:.1f} "
                                                     rf"MiB but {5 * row / 2**21:.1f} MiB of memory is available "
                                                     r"\(MemAvailable\)"):
            runtime.reserve(4, 1024)
        assert (runtime.rows, runtime.max_seq, runtime.cache) == (1, 1024, None)
        runtime.reserve(2, 1024)
        assert runtime.prefill(1, torch.tensor([1, 5, 9])).shape == (model.config.vocab_size,)
    monkeypatch.setattr(memory, "meminfo_available_bytes", lambda: None)  # unreadable: no check
    runtimes[0].reserve(8, 1024)
