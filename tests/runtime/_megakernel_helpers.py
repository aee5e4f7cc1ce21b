"""Shared helpers of the monokernel tests: a tiny model lowered for a few SMs, eager prefill, noisy buffers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solo.model.transformer import Transformer
from solo.runtime.eager import EagerRuntime
from solo.runtime.megakernel.graph import Dims, lower_decode_step, plan_dims
from solo.runtime.megakernel.schedule import Program, schedule
from solo.runtime.megakernel.vm import ACTIVATION_BUFFERS, MegakernelVM, make_buffers, model_weights, set_state

PROMPT = [1, 5, 9, 33, 70, 2, 100, 7, 250, 31]
MAX_SEQ = 40
NUM_SMS = 6


@dataclass
class Setup:
    """A tiny model, its eager runtime after the prompt's prefill, and a lowered program."""

    model: Transformer
    eager: EagerRuntime
    first_token: int
    dims: Dims
    program: Program


def lowered(model: Transformer, num_sms: int = NUM_SMS, max_seq: int = MAX_SEQ) -> Setup:
    eager = EagerRuntime(model)
    eager.reserve(1, max_seq)
    logits = eager.prefill(0, torch.tensor(PROMPT))
    # Small tiles so even a tiny model has many tasks per stage.
    dims = plan_dims(model.config, max_seq, num_sms=num_sms, elem_bytes=model.dtype.itemsize, tile_bytes=2048)
    program = schedule(lower_decode_step(dims), num_sms)
    return Setup(model, eager, int(logits.argmax()), dims, program)


def make_vm(setup: Setup, ring_len: int = 16, noise: bool = True) -> MegakernelVM:
    """A VM whose KV cache holds the eager prefill; unused slots and all activations are NaN."""
    d = setup.dims
    bufs = make_buffers(d, setup.model.dtype, "cpu", ring_len, setup.program.num_counters)
    for layer in range(d.layers):
        bufs["k_cache"][layer] = setup.eager.cache.k[layer][0]
        bufs["v_cache"][layer] = setup.eager.cache.v[layer][0]
    if noise:
        for name in ("k_cache", "v_cache"):
            bufs[name][:, :, len(PROMPT):] = float("nan")
        for name in ACTIVATION_BUFFERS:
            if bufs[name].is_floating_point():
                bufs[name].fill_(float("nan"))
    return MegakernelVM(setup.program, model_weights(setup.model, d.max_seq), bufs)


def start(vm: MegakernelVM, token: int, pos: int, budget: int, stop_ids: tuple[int, ...] = (),
          temperature: float = 0.0, seed: int = 0) -> None:
    set_state(vm.b["state"], token, pos, budget, stop_ids, temperature, seed)
