"""The monokernel's program, executed by the Python VM, matches the eager model buffer by buffer."""

from __future__ import annotations

import pytest
import torch
from _cuda_helpers import TinyCheckpoints, eager_greedy
from _megakernel_helpers import PROMPT, lowered, make_vm, start

from solo.runtime.megakernel.graph import (
    OP_ATTN,
    OP_GATE_UP,
    OP_QKV,
    STATE_DONE,
    STATE_EMITTED,
    STATE_POS,
    lower_decode_step,
    megakernel_unsupported_reason,
    plan_dims,
)
from solo.runtime.megakernel.schedule import W_OP, schedule


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return TinyCheckpoints(tmp_path_factory.mktemp("mk-ckpts"))


@pytest.fixture(autouse=True)
def one_thread():
    # Thousands of tiny ops: thread start-up would dominate on a shared machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _eager_trace(model, token: int, pos: int, cache) -> dict:
    """Eager intermediates of one decode step: per layer attn (o_proj input), x1, h, x0; logits."""
    trace, handles = {}, []
    for i, layer in enumerate(model.layers):
        handles.append(layer.attn.o_proj.register_forward_pre_hook(
            lambda m, a, i=i: trace.__setitem__(f"attn[{i}]", a[0].reshape(-1).clone())))
        handles.append(layer.mlp_norm.register_forward_pre_hook(
            lambda m, a, i=i: trace.__setitem__(f"oproj[{i}]", a[0].reshape(-1).clone())))
        handles.append(layer.mlp.down_proj.register_forward_pre_hook(
            lambda m, a, i=i: trace.__setitem__(f"gate_up[{i}]", a[0].reshape(-1).clone())))
        handles.append(layer.register_forward_hook(
            lambda m, a, out, i=i: trace.__setitem__(f"down[{i}]", out.reshape(-1).clone())))
    try:
        with torch.inference_mode():
            logits = model(torch.tensor([[token]]), torch.tensor([[pos]]), cache, torch.tensor([0]), last_only=True)
    finally:
        for h in handles:
            h.remove()
    trace["lm_head"] = logits.reshape(-1).float()
    return trace


_SNAPSHOT = {"attn": "attn", "oproj": "x1", "gate_up": "h", "down": "x0", "lm_head": "logits"}


def test_one_step_matches_eager_buffer_by_buffer(ckpts):
    setup = lowered(ckpts.model("llama"))
    vm = make_vm(setup)
    snaps = {}

    def on_counter(counter, step):
        name = setup.program.counter_names[counter]
        stage = name.split("[")[0]
        if stage in _SNAPSHOT:
            snaps[name] = vm.b[_SNAPSHOT[stage]].float().clone()

    pos = len(PROMPT)
    start(vm, setup.first_token, pos, budget=1)
    vm.launch(1, on_counter=on_counter)
    want = _eager_trace(setup.model, setup.first_token, pos, setup.eager.cache)
    assert set(snaps) == set(want)
    for name, ref in want.items():
        torch.testing.assert_close(snaps[name], ref.float(), rtol=1e-4, atol=1e-5, msg=name)
    for layer in range(setup.dims.layers):  # the cache slot this step wrote
        torch.testing.assert_close(vm.b["k_cache"][layer, :, pos], setup.eager.cache.k[layer][0, :, pos])
        torch.testing.assert_close(vm.b["v_cache"][layer, :, pos], setup.eager.cache.v[layer][0, :, pos])
    assert vm.b["ring"][0] == int(want["lm_head"].argmax())
    assert vm.b["state"][STATE_POS] == pos + 1 and vm.b["state"][STATE_DONE] == 1


@pytest.mark.parametrize("num_sms", [5, 3])
def test_n_tokens_per_launch_match_eager_greedy(ckpts, num_sms):
    model = ckpts.model("llama")
    steps = 8
    tokens, _ = eager_greedy(model, PROMPT, steps + 1)
    setup = lowered(model, num_sms=num_sms)
    vm = make_vm(setup)
    start(vm, setup.first_token, len(PROMPT), budget=steps)
    vm.launch(steps)
    assert vm.b["ring"][:steps].tolist() == tokens[1:steps + 1]
    assert vm.b["state"][STATE_EMITTED] == steps and vm.b["state"][STATE_DONE] == 1


def test_single_token_launches_continue_the_sequence(ckpts):
    model = ckpts.model("llama")
    tokens, _ = eager_greedy(model, PROMPT, 5)
    setup = lowered(model)
    vm = make_vm(setup)
    token, got = setup.first_token, []
    for i in range(4):
        start(vm, token, len(PROMPT) + i, budget=1)
        vm.launch(1)
        token = int(vm.b["ring"][0])
        got.append(token)
    assert got == tokens[1:5]


def test_stop_token_ends_the_launch_and_later_steps_change_nothing(ckpts):
    model = ckpts.model("llama")
    tokens, _ = eager_greedy(model, PROMPT, 8)
    setup = lowered(model)
    vm = make_vm(setup)
    stop = tokens[3]
    start(vm, setup.first_token, len(PROMPT), budget=7, stop_ids=(999, stop))
    vm.launch(7)
    n = tokens[1:].index(stop) + 1
    assert vm.b["ring"][:n].tolist() == tokens[1:n + 1]
    assert vm.b["state"][STATE_EMITTED] == n and vm.b["state"][STATE_DONE] == 1
    assert vm.b["state"][STATE_POS] == len(PROMPT) + n
    # The slots after the last processed position were never written (still NaN noise).
    assert torch.isnan(vm.b["k_cache"][:, :, len(PROMPT) + n:]).all()


def test_bf16_logits_within_tolerance(ckpts):
    model = ckpts.model("llama", dtype=torch.bfloat16)
    setup = lowered(model)
    vm = make_vm(setup)
    pos = len(PROMPT)
    start(vm, setup.first_token, pos, budget=1)
    vm.launch(1)
    want = _eager_trace(setup.model, setup.first_token, pos, setup.eager.cache)["lm_head"]
    # bf16: products accumulate in float32 in both, rounding points differ in the last bit.
    torch.testing.assert_close(vm.b["logits"], want, rtol=0.02, atol=0.05)


def test_lowering_shapes_and_refusals(ckpts):
    model = ckpts.model("llama")
    assert megakernel_unsupported_reason(model.config) is None
    assert megakernel_unsupported_reason(ckpts.model("gemma2").config) is not None
    assert "q/k RMSNorm" in megakernel_unsupported_reason(ckpts.model("qwen3").config)
    assert "biases" in megakernel_unsupported_reason(ckpts.model("qwen2").config)
    assert "per-layer RoPE" in megakernel_unsupported_reason(ckpts.model("smollm3").config)
    # A Llama-3.2-1B-shaped config on 132 SMs: about one wave of tiles per stage, tiles within 64 KiB.
    from dataclasses import replace
    cfg = replace(model.config, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                  num_kv_heads=8, head_dim=64, vocab_size=128256)
    dims = plan_dims(cfg, 4096, num_sms=132)
    graph = lower_decode_step(dims)
    program = schedule(graph, 132)
    per_layer = {op: sum(1 for t in graph.tasks if t.op == op and t.layer == 0) for op in (OP_QKV, OP_ATTN, OP_GATE_UP)}
    assert 100 <= per_layer[OP_QKV] <= 400 and per_layer[OP_ATTN] == 8 * dims.splits
    assert dims.gu_rows * 2 * 2048 * 2 <= 64 * 1024 and dims.down_rows * 8192 * 2 <= 64 * 1024
    assert (program.lengths > 0).all() and int(program.lengths.sum()) == len(graph.tasks)
    # Every SM's queue is in topological (task) order.
    for sm in range(132):
        q = program.queue(sm)
        assert (q[1:, 10] > q[:-1, 10]).all() and q[0, W_OP] >= 0


def test_tied_embeddings_and_llama3_rope(tmp_path):
    from checkpoints import make_checkpoint

    from solo.model.config import ModelConfig
    from solo.model.weights import load_weights

    folder = make_checkpoint(tmp_path / "tied", "llama", tie_word_embeddings=True, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))
    model = load_weights(folder, ModelConfig.from_file(folder), torch.float32, torch.device("cpu"))
    assert model.lm_head is None and model.config.rope.rope_type == "llama3"
    steps = 6
    tokens, _ = eager_greedy(model, PROMPT, steps + 1)
    setup = lowered(model)
    vm = make_vm(setup)
    start(vm, setup.first_token, len(PROMPT), budget=steps)
    vm.launch(steps)
    assert vm.b["ring"][:steps].tolist() == tokens[1:steps + 1]


def test_gumbel_max_samples_the_softmax():
    from solo.runtime.megakernel.graph import gumbel_noise

    torch.manual_seed(0)
    logits = torch.randn(12) * 2
    temperature = 0.7
    ids = torch.arange(12)
    counts = torch.zeros(12)
    for seed in range(4000):
        counts[int(torch.argmax(logits / temperature + gumbel_noise(seed, 5, ids)))] += 1
    want = torch.softmax(logits / temperature, dim=0)
    assert 0.5 * float((counts / counts.sum() - want).abs().sum()) < 0.03


def test_temperature_sampling_is_seeded_by_position(ckpts):
    model = ckpts.model("llama")
    setup = lowered(model)
    runs = []
    for per_launch in (6, 2, 1):
        vm = make_vm(setup)
        token, pos, out = setup.first_token, len(PROMPT), []
        while len(out) < 6:
            start(vm, token, pos, budget=per_launch, temperature=1.5, seed=11)
            vm.launch(per_launch)
            out += vm.b["ring"][:per_launch].tolist()
            token, pos = out[-1], pos + per_launch
        runs.append(out)
    assert runs[0] == runs[1] == runs[2]
    vm = make_vm(setup)
    start(vm, setup.first_token, len(PROMPT), budget=6, temperature=1.5, seed=12)
    vm.launch(6)
    assert vm.b["ring"][:6].tolist() != runs[0]  # another seed, another sample (for this model and prompt)
