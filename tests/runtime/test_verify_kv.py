"""Runtime capabilities for prefix caching and speculative decoding: multi-token verify and KV export/import."""

from __future__ import annotations

import pytest
import torch
from checkpoints import make_checkpoint

from solo.model.config import ModelConfig
from solo.model.weights import load_weights
from solo.runtime.base import supports_kv_snapshots, supports_verify
from solo.runtime.cpu import CpuRuntime
from solo.runtime.eager import EagerRuntime

PROMPT = [1, 17, 93, 5, 250, 31, 77, 8, 140, 66, 12, 301, 9, 44, 2, 180, 23]  # longer than the sliding windows
DRAFT = [40, 7, 301, 99, 12, 5]


@pytest.fixture(scope="module", params=["llama", "gemma2"])
def folder(request, tmp_path_factory):
    # gemma2: sliding-window layers and soft-capping, the cases where cached KV is easiest to get wrong.
    return make_checkpoint(tmp_path_factory.mktemp(request.param), request.param)


def _runtime(kind, folder):
    model = load_weights(folder, ModelConfig.from_file(folder), torch.float32)
    if kind == "cuda-torch":  # the CUDA runtime's own code paths, run on the CPU without graphs
        from solo.runtime.cuda.runtime import CudaGraphRuntime

        runtime = CudaGraphRuntime(model, step="torch", use_graphs=False)
    else:
        runtime = CpuRuntime(model) if kind == "cpu" else EagerRuntime(model)
    runtime.reserve(3, 64)
    return runtime


KINDS = ["eager", "cpu", "cuda-torch"]


@pytest.mark.parametrize("kind", KINDS)
def test_verify_gives_every_position_of_sequential_decode(folder, kind):
    runtime = _runtime(kind, folder)
    assert supports_verify(runtime) and supports_kv_snapshots(runtime)
    runtime.prefill(0, torch.tensor(PROMPT))
    steps = []
    for i, token in enumerate(DRAFT):
        pos = torch.tensor([len(PROMPT) + i])
        steps.append(runtime.decode(torch.tensor([0]), torch.tensor([token]), pos)[0])
    sequential = torch.stack(steps)
    runtime.prefill(1, torch.tensor(PROMPT))
    verified = runtime.verify(1, torch.tensor(DRAFT), len(PROMPT))
    assert verified.shape == sequential.shape and verified.dtype == torch.float32
    if runtime.verify_matches_decode:
        assert torch.equal(verified, sequential)  # the native kernel, bit for bit
    else:
        torch.testing.assert_close(verified, sequential, atol=1e-4, rtol=0)
    # Afterwards the row continues as if it had decoded the tokens one by one.
    nxt = torch.tensor([len(PROMPT) + len(DRAFT)])
    a = runtime.decode(torch.tensor([0]), torch.tensor([3]), nxt)[0]
    b = runtime.decode(torch.tensor([1]), torch.tensor([3]), nxt)[0]
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_exported_kv_continues_bit_identically_in_another_row(folder, kind):
    runtime = _runtime(kind, folder)
    runtime.prefill(0, torch.tensor(PROMPT))
    snapshot = runtime.export_kv(0, len(PROMPT))
    assert snapshot.length == len(PROMPT) and snapshot.nbytes > 0
    runtime.prefill(2, torch.tensor([5, 6, 7]))  # unrelated content, overwritten below
    runtime.import_kv(2, snapshot, len(PROMPT))
    pos = torch.tensor([len(PROMPT)])
    a = runtime.decode(torch.tensor([0]), torch.tensor([42]), pos)[0]
    b = runtime.decode(torch.tensor([2]), torch.tensor([42]), pos)[0]
    assert torch.equal(a, b)


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_of_a_tail_after_a_cached_prefix_matches_a_whole_prefill(folder, kind):
    runtime = _runtime(kind, folder)
    whole = runtime.prefill(0, torch.tensor(PROMPT))
    split = 11
    runtime.prefill(1, torch.tensor(PROMPT[:split]))
    tail = runtime.prefill(1, torch.tensor(PROMPT[split:]), split)
    torch.testing.assert_close(tail, whole, atol=1e-4, rtol=0)
    assert int(tail.argmax()) == int(whole.argmax())


def test_a_short_tail_after_a_cached_prefix_is_the_decode_steps_bit_for_bit(folder):
    # CpuRuntime.prefill runs a short tail after a longer cached prefix through the decode kernel on every
    # thread: its keys, values and last logits are those of one decode step per token.
    runtime = _runtime("cpu", folder)
    runtime.num_threads = 2  # entries share a row: the kernel's barrier must order their cache writes
    split = 9
    assert len(PROMPT) - split <= min(split, runtime.span_prefill_tokens)
    runtime.prefill(0, torch.tensor(PROMPT[:split]))
    for i, token in enumerate(PROMPT[split:]):
        stepped = runtime.decode(torch.tensor([0]), torch.tensor([token]), torch.tensor([split + i]))[0]
    runtime.prefill(1, torch.tensor(PROMPT[:split]))
    tail = runtime.prefill(1, torch.tensor(PROMPT[split:]), split)
    assert tail.shape == (runtime.config.vocab_size,) and tail.dtype == torch.float32
    assert torch.equal(tail, stepped)
    for layer in range(runtime.config.num_layers):
        assert torch.equal(runtime.cache.k[layer][1, :, :len(PROMPT)], runtime.cache.k[layer][0, :, :len(PROMPT)])
        assert torch.equal(runtime.cache.v[layer][1, :, :len(PROMPT)], runtime.cache.v[layer][0, :, :len(PROMPT)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_both_cpu_tail_paths_match_the_eager_oracle(folder, dtype):
    eager = EagerRuntime(load_weights(folder, ModelConfig.from_file(folder), dtype))
    runtime = CpuRuntime(load_weights(folder, ModelConfig.from_file(folder), dtype))
    split = 9  # a tail no longer than the prefix: the decode kernel takes it when the span allows
    eager.reserve(1, 64)
    eager.prefill(0, torch.tensor(PROMPT[:split]))
    expected = eager.prefill(0, torch.tensor(PROMPT[split:]), split)
    runtime.reserve(2, 64)
    # span 0: batched matmuls (the long-tail path); 64: the decode kernel.
    atol = 1e-4 if dtype == torch.float32 else 0.15  # bf16: as the CPU runtime's prefill against eager
    runtime.span_prefill_positions = 0  # short prompts: only the tail decides the path here
    for row, span in ((0, 0), (1, 64)):
        runtime.span_prefill_tokens = span
        runtime.prefill(row, torch.tensor(PROMPT[:split]))
        torch.testing.assert_close(runtime.prefill(row, torch.tensor(PROMPT[split:]), split), expected, atol=atol,
                                   rtol=0)


def test_verify_gives_the_same_bits_on_one_thread_and_two(folder):
    runtime = _runtime("cpu", folder)
    runtime.prefill(0, torch.tensor(PROMPT))
    runtime.prefill(1, torch.tensor(PROMPT))
    runtime.num_threads = 1
    one = runtime.verify(0, torch.tensor(DRAFT), len(PROMPT))
    runtime.num_threads = 2
    two = runtime.verify(1, torch.tensor(DRAFT), len(PROMPT))
    assert torch.equal(one, two)


@pytest.mark.parametrize("kind", KINDS)
def test_import_from_a_start_position_keeps_what_the_row_holds(folder, kind):
    runtime = _runtime(kind, folder)
    runtime.prefill(0, torch.tensor(PROMPT))
    snapshot = runtime.export_kv(0, len(PROMPT))
    runtime.prefill(2, torch.tensor(PROMPT[:6] + [5, 6, 7]))  # the same first 6 tokens, then others
    before = [layer[2, :, :6].clone() for layer in runtime.cache.k]
    runtime.import_kv(2, snapshot, len(PROMPT), start=6)
    for layer, kept in zip(runtime.cache.k, before, strict=True):
        assert torch.equal(layer[2, :, :6], kept)
        assert torch.equal(layer[2, :, 6:len(PROMPT)], layer[0, :, 6:len(PROMPT)])
    pos = torch.tensor([len(PROMPT)])
    a = runtime.decode(torch.tensor([0]), torch.tensor([42]), pos)[0]
    b = runtime.decode(torch.tensor([2]), torch.tensor([42]), pos)[0]
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)



@pytest.mark.parametrize("dtype,mode", [(torch.bfloat16, None), (torch.bfloat16, "int8"), (torch.bfloat16, "int4"),
                                        (torch.float32, "int8")])
def test_cpu_verify_equals_decode_steps_bit_for_bit_in_every_format(folder, dtype, mode):
    # Why speculative decoding on the CPU runtime never changes a greedy output: verify's k positions are
    # summed in the order of k batch-1 steps for every weight format (CpuRuntime.verify_matches_decode).
    from solo.runtime.quant import quantize_model

    model = load_weights(folder, ModelConfig.from_file(folder), dtype)
    if mode is not None:
        model = quantize_model(model, mode)
    runtime = CpuRuntime(model)
    runtime.reserve(2, 64)
    assert runtime.verify_matches_decode
    runtime.prefill(0, torch.tensor(PROMPT))
    steps = [runtime.decode(torch.tensor([0]), torch.tensor([t]), torch.tensor([len(PROMPT) + i]))[0]
             for i, t in enumerate(DRAFT)]
    runtime.prefill(1, torch.tensor(PROMPT))
    assert torch.equal(runtime.verify(1, torch.tensor(DRAFT), len(PROMPT)), torch.stack(steps))
