"""A Python VM for the monokernel's encoded program: the same instructions, executed with PyTorch ops.

`MegakernelVM` owns the buffers the kernel would (activations, split-KV partials, the KV cache, the
device state, the token ring, the counters) and executes the int32 instructions of a `Program` one by
one, with the counter semantics of the interpreter kernel: SM i runs its queue in order, once per step,
and an instruction starts only when each counter it waits on holds `target * (step + 1)`. The order
in which ready instructions run is a policy: `launch` uses a fixed one (lowest ready SM first),
`solo.runtime.megakernel.checker` drives `run_launch` with random ones.

Each opcode's reads and writes are declared element by element (`regions`), which is what the
schedule checker compares across orders. Numerics mirror the eager model (see `graph`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from solo.model.transformer import Transformer
from solo.runtime.megakernel.graph import (
    OP_ATTN,
    OP_DOWN,
    OP_EMBED,
    OP_GATE_UP,
    OP_LM_HEAD,
    OP_MERGE,
    OP_NAMES,
    OP_NOP,
    OP_OPROJ,
    OP_QKV,
    OP_SAMPLE,
    STATE_BUDGET,
    STATE_DONE,
    STATE_EMITTED,
    STATE_NUM_STOP,
    STATE_POS,
    STATE_SEED,
    STATE_STOP,
    STATE_TEMPERATURE,
    STATE_TOKEN,
    STATE_WORDS,
    Dims,
    gumbel_noise,
    split_range,
)
from solo.runtime.megakernel.schedule import (
    W_A,
    W_B,
    W_C,
    W_LAYER,
    W_OP,
    W_SIGNAL,
    W_TARGET0,
    W_TARGET1,
    W_WAIT0,
    W_WAIT1,
    Program,
)

ACTIVATION_BUFFERS = ("x0", "x1", "q", "attn", "h", "part_o", "part_ml", "logits", "amax_val", "amax_idx")
"""Buffers a step overwrites before reading (filled with NaN / noise at a launch in tests)."""


class DeadlockError(RuntimeError):
    """No SM can start its next instruction and none is running: some counter never reaches its target."""


class HazardError(RuntimeError):
    """An instruction read data its producer had not written yet, or that a later writer overwrote."""


@dataclass
class LayerWeights:
    """One decoder layer's weights as the kernel reads them.

    Attributes:
        attn_norm, mlp_norm: [hidden].
        w_qkv: [(heads + 2 kv_heads) * head_dim, hidden], rows q | k | v (HF order within each head).
        w_o: [hidden, heads * head_dim].
        w_gate_up: [2 * inter, hidden], rows gate | up.
        w_down: [hidden, inter].
    """

    attn_norm: torch.Tensor
    w_qkv: torch.Tensor
    w_o: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor


@dataclass
class ModelWeights:
    """The weights of a dense Llama-family model in the kernel's layout.

    Attributes:
        embed: [vocab, hidden]; lm_head: [vocab, hidden] (the same tensor when tied); final_norm: [hidden].
        layers: per layer.
        rope_cos, rope_sin: [max_seq, head_dim // 2] in the weights' dtype (the eager tables' first half).
    """

    embed: torch.Tensor
    lm_head: torch.Tensor
    final_norm: torch.Tensor
    layers: list[LayerWeights]
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor


def model_weights(model: Transformer, max_seq: int) -> ModelWeights:
    """The eager model's weights in the kernel's layout (QKV and gate/up fused, sharing storage).

    Args:
        model: a dense Llama-family eager model.
        max_seq: positions the RoPE tables cover.

    Returns:
        `ModelWeights` on the model's device. The eager model's q/k/v and gate/up parameters become
        views of the fused tensors (values unchanged; `solo.runtime.cuda.weights.fused_layers`).
    """
    from solo.runtime.cuda.weights import fused_layers

    fused = fused_layers(model)
    layers = [
        LayerWeights(attn_norm=layer.attn_norm.weight.detach(), w_qkv=f.w_qkv, w_o=f.w_o.detach(),
                     mlp_norm=layer.mlp_norm.weight.detach(), w_gate_up=f.w_gate_up, w_down=f.w_down.detach())
        for layer, f in zip(model.layers, fused, strict=True)
    ]
    positions = torch.arange(max_seq, device=model.device).view(1, -1)
    cos, sin = model.rotary(positions, model.dtype)  # [1, max_seq, head_dim]
    half = model.config.head_dim // 2
    return ModelWeights(
        embed=model.embed.weight.detach(), lm_head=model.lm_head_weight().detach(),
        final_norm=model.norm.weight.detach(), layers=layers,
        rope_cos=cos[0, :, :half].contiguous(), rope_sin=sin[0, :, :half].contiguous(),
    )


def make_buffers(dims: Dims, dtype: torch.dtype, device: torch.device | str, ring_len: int,
                 num_counters: int, with_cache: bool = True) -> dict[str, torch.Tensor]:
    """The kernel's mutable buffers, zeroed.

    `with_cache=False` leaves out k_cache / v_cache (the GPU runtime points the kernel at its
    `KVCache` rows instead).

    Returns:
        name -> tensor: x0, x1 [hidden]; q, attn [heads * head_dim]; h [inter] (weights' dtype);
        k_cache, v_cache [layers, kv_heads, max_seq, head_dim] (dtype); part_o float32 [kv_heads,
        splits, groups, head_dim]; part_ml float32 [kv_heads, splits, groups, 2] (running max, sum);
        logits float32 [vocab]; amax_val float32 / amax_idx int32 [lm_tiles]; state int32
        [STATE_WORDS]; ring int32 [ring_len]; counters int32 [num_counters].
    """
    d = dims

    def act(*shape, dt=dtype):
        return torch.zeros(shape, dtype=dt, device=device)

    buffers = {
        "x0": act(d.hidden), "x1": act(d.hidden), "q": act(d.q_size), "attn": act(d.q_size), "h": act(d.inter),
        "part_o": act(d.kv_heads, d.splits, d.groups, d.head_dim, dt=torch.float32),
        "part_ml": act(d.kv_heads, d.splits, d.groups, 2, dt=torch.float32),
        "logits": act(d.vocab, dt=torch.float32),
        "amax_val": act(d.lm_tiles, dt=torch.float32), "amax_idx": act(d.lm_tiles, dt=torch.int32),
        "state": act(STATE_WORDS, dt=torch.int32), "ring": act(max(1, ring_len), dt=torch.int32),
        "counters": act(max(1, num_counters), dt=torch.int32),
    }
    if with_cache:
        buffers["k_cache"] = act(d.layers, d.kv_heads, d.max_seq, d.head_dim)
        buffers["v_cache"] = act(d.layers, d.kv_heads, d.max_seq, d.head_dim)
    return buffers


def set_state(state: torch.Tensor, token: int, pos: int, budget: int, stop_ids: tuple[int, ...] = (),
              temperature: float = 0.0, seed: int = 0) -> None:
    """Write a launch's device state (int32 [STATE_WORDS], any device).

    The launch starts from `token` at position `pos`, may emit at most `budget` tokens, and stops after
    any of `stop_ids` (at most MAX_STOP_IDS). temperature > 0 samples (Gumbel-max, `gumbel_noise`)
    with `seed` (reduced to 31 bits) instead of taking the argmax.

    Raises:
        ValueError: too many stop ids.
    """
    from solo.runtime.megakernel.graph import MAX_STOP_IDS

    if len(stop_ids) > MAX_STOP_IDS:
        raise ValueError(f"at most {MAX_STOP_IDS} stop ids per launch, got {len(stop_ids)}")
    words = [0] * STATE_WORDS
    words[STATE_POS], words[STATE_TOKEN], words[STATE_BUDGET] = pos, token, budget
    words[STATE_NUM_STOP] = len(stop_ids)
    words[STATE_STOP: STATE_STOP + len(stop_ids)] = list(stop_ids)
    words[STATE_TEMPERATURE] = struct.unpack("<i", struct.pack("<f", float(temperature)))[0]
    words[STATE_SEED] = int(seed) % 2**31
    state.copy_(torch.tensor(words, dtype=torch.int32))


def _as_float(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<i", bits))[0]


def signals(op: int, step: int, n_steps: int) -> bool:
    """Whether an instruction signals its counter at `step` of an `n_steps` launch.

    EMBED signals at step 0 only; SAMPLE (which embeds the next token) at every step but the last.
    """
    if op == OP_EMBED:
        return step == 0
    if op == OP_SAMPLE:
        return step < n_steps - 1
    return True


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # The eager RMSNorm (Llama): float32 statistics, rounded to the dtype, then times the weight.
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean() + eps)).to(x.dtype)


def _matvec(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (w.float() @ x.float()).to(x.dtype)


class MegakernelVM:
    """Executes a `Program`'s instructions with PyTorch ops (the kernel's reference semantics).

    Args:
        program: the encoded step.
        weights: from `model_weights`.
        buffers: from `make_buffers` (the VM reads and writes them in place).
    """

    def __init__(self, program: Program, weights: ModelWeights, buffers: dict[str, torch.Tensor]) -> None:
        self.program = program
        self.dims = program.dims
        self.w = weights
        self.b = buffers

    # ------------------------------------------------------------------------------- one instruction

    def execute(self, instr: np.ndarray, step: int, n_steps: int) -> None:
        """Run one instruction (its compute only; counters are the launcher's job)."""
        op = int(instr[W_OP])
        if op == OP_NOP or (op == OP_EMBED and step > 0):
            return
        b, d = self.b, self.dims
        if int(b["state"][STATE_DONE]) and op != OP_EMBED:
            return  # after a stop token the remaining steps change nothing
        pos = int(b["state"][STATE_POS])
        layer, a, bb, c = (int(instr[i]) for i in (W_LAYER, W_A, W_B, W_C))
        if op == OP_EMBED:
            b["x0"].copy_(self.w.embed[int(b["state"][STATE_TOKEN])])
        elif op == OP_QKV:
            self._qkv(layer, a, bb, c, pos)
        elif op == OP_ATTN:
            self._attn(layer, a, bb, pos)
        elif op == OP_MERGE:
            self._merge(a)
        elif op == OP_OPROJ:
            w = self.w.layers[layer].w_o
            b["x1"][a:a + bb] = b["x0"][a:a + bb] + _matvec(w[a:a + bb], b["attn"])
        elif op == OP_GATE_UP:
            lw = self.w.layers[layer]
            xn = _rms(b["x1"], lw.mlp_norm, d.eps)
            gate = _matvec(lw.w_gate_up[a:a + bb], xn)
            up = _matvec(lw.w_gate_up[d.inter + a:d.inter + a + bb], xn)
            b["h"][a:a + bb] = F.silu(gate) * up
        elif op == OP_DOWN:
            w = self.w.layers[layer].w_down
            b["x0"][a:a + bb] = b["x1"][a:a + bb] + _matvec(w[a:a + bb], b["h"])
        elif op == OP_LM_HEAD:
            xn = _rms(b["x0"], self.w.final_norm, d.eps)
            logits = _matvec(self.w.lm_head[a:a + bb], xn).float()
            b["logits"][a:a + bb] = logits
            temperature = _as_float(int(b["state"][STATE_TEMPERATURE]))
            scores = logits
            if temperature > 0:
                ids = torch.arange(a, a + bb, device=logits.device)
                scores = logits / temperature + gumbel_noise(int(b["state"][STATE_SEED]), pos, ids)
            best = int(torch.argmax(scores))  # first index of the maximum, as torch.argmax
            b["amax_val"][c] = scores[best]
            b["amax_idx"][c] = a + best
        elif op == OP_SAMPLE:
            self._sample(step, n_steps)
        else:
            raise ValueError(f"unknown opcode {op}")

    def _qkv(self, layer: int, head: int, j: int, pairs: int, pos: int) -> None:
        d, b = self.dims, self.b
        lw = self.w.layers[layer]
        hd, half = d.head_dim, d.head_dim // 2
        xn = _rms(b["x0"], lw.attn_norm, d.eps)
        base = head * hd
        y1 = _matvec(lw.w_qkv[base + j:base + j + pairs], xn)
        y2 = _matvec(lw.w_qkv[base + half + j:base + half + j + pairs], xn)
        if head < d.heads + d.kv_heads:  # q and k heads get RoPE (rotate-half layout)
            cos, sin = self.w.rope_cos[pos, j:j + pairs], self.w.rope_sin[pos, j:j + pairs]
            y1, y2 = y1 * cos + (-y2) * sin, y2 * cos + y1 * sin
        if head < d.heads:
            out = b["q"][base:base + hd]
        elif head < d.heads + d.kv_heads:
            out = b["k_cache"][layer, head - d.heads, pos]
        else:
            out = b["v_cache"][layer, head - d.heads - d.kv_heads, pos]
        out[j:j + pairs] = y1
        out[half + j:half + j + pairs] = y2

    def _attn(self, layer: int, group: int, split: int, pos: int) -> None:
        d, b = self.dims, self.b
        lo, hi = split_range(pos + 1, d.splits, split)
        heads = slice(group * d.groups * d.head_dim, (group + 1) * d.groups * d.head_dim)
        q = b["q"][heads].view(d.groups, d.head_dim).float()
        if hi <= lo:
            b["part_o"][group, split] = 0.0
            b["part_ml"][group, split, :, 0] = float("-inf")
            b["part_ml"][group, split, :, 1] = 0.0
            return
        keys = b["k_cache"][layer, group, lo:hi].float()
        values = b["v_cache"][layer, group, lo:hi].float()
        scores = (q @ keys.T) * d.attn_scale  # [groups, n]
        m = scores.max(dim=1).values
        p = torch.exp(scores - m[:, None])
        b["part_o"][group, split] = p @ values
        b["part_ml"][group, split, :, 0] = m
        b["part_ml"][group, split, :, 1] = p.sum(dim=1)

    def _merge(self, group: int) -> None:
        d, b = self.dims, self.b
        m, ell = b["part_ml"][group, :, :, 0], b["part_ml"][group, :, :, 1]  # [splits, groups]
        top = m.max(dim=0).values
        scale = torch.exp(m - top[None])  # empty splits: exp(-inf) = 0
        total = (scale * ell).sum(dim=0)
        out = (scale[:, :, None] * b["part_o"][group]).sum(dim=0) / total[:, None]
        heads = slice(group * d.groups * d.head_dim, (group + 1) * d.groups * d.head_dim)
        b["attn"][heads] = out.reshape(-1).to(b["attn"].dtype)

    def _sample(self, step: int, n_steps: int) -> None:
        b = self.b
        state = b["state"]
        vals, idxs = b["amax_val"].tolist(), b["amax_idx"].tolist()
        best = 0
        for t in range(1, len(vals)):
            if vals[t] > vals[best]:  # ties keep the lower tile (lower token id), as torch.argmax
                best = t
        token = int(idxs[best])
        emitted = int(state[STATE_EMITTED])
        b["ring"][emitted] = token
        emitted += 1
        stops = state[STATE_STOP: STATE_STOP + int(state[STATE_NUM_STOP])].tolist()
        done = token in stops or emitted >= int(state[STATE_BUDGET])
        state[STATE_EMITTED] = emitted
        state[STATE_TOKEN] = token
        state[STATE_POS] = int(state[STATE_POS]) + 1
        state[STATE_DONE] = int(done)
        if not done and step < n_steps - 1:
            b["x0"].copy_(self.w.embed[token])

    # ------------------------------------------------------------------------------------ a launch

    def launch(self, n_steps: int, on_counter: Callable[[int, int], None] | None = None) -> None:
        """Run `n_steps` decode steps from the current state (counters zeroed first), in the fixed order.

        The fixed order: the lowest-numbered SM whose next instruction is ready runs it to completion.

        Args:
            n_steps: steps (tokens) in this launch.
            on_counter: called as on_counter(counter, step) whenever a counter completes a step's
                target (all of that stage's tasks of the step are done), e.g. to snapshot buffers.

        Raises:
            DeadlockError: the program cannot finish.
        """
        self.b["counters"].zero_()
        run_launch(self.program, n_steps, self.b["counters"], self.execute, on_counter=on_counter)


def run_launch(program: Program, n_steps: int, counters: torch.Tensor,
               execute: Callable[[np.ndarray, int, int], None],
               rng: np.random.Generator | None = None,
               on_start: Callable[[int, np.ndarray, int], None] | None = None,
               on_finish: Callable[[int, np.ndarray, int], None] | None = None,
               on_counter: Callable[[int, int], None] | None = None) -> None:
    """Execute a launch of `n_steps` steps under the interpreter's counter semantics.

    Without `rng`, each instruction runs to completion in turn (lowest ready SM first). With it, up to
    one instruction per SM is in flight and the next event (some SM starts its next ready instruction,
    or an in-flight one finishes) is drawn at random: `on_start` sees the reads begin, `execute` and
    then `on_finish` run when it completes, and its counter is signalled after that.

    Args:
        program: the encoded step.
        n_steps: steps in the launch.
        counters: int32 [num_counters], incremented in place (not zeroed here).
        execute: runs an instruction's compute: execute(instr, step, n_steps).
        rng: None for the fixed order, else the random source.
        on_start, on_finish: hooks called as hook(sm, instr, step).
        on_counter: called as on_counter(counter, step) when a counter reaches its step's target.

    Raises:
        DeadlockError: no SM can proceed and none is in flight, before every instruction ran.
    """
    num_sms = program.num_sms
    lengths = [int(n) for n in program.lengths]
    targets = program.counter_targets
    pc = [0] * num_sms  # flat index over (step, instruction)
    total = [n * n_steps for n in lengths]
    running: dict[int, tuple[np.ndarray, int]] = {}
    count = counters.tolist() if counters.numel() >= program.num_counters else [0] * program.num_counters

    def ready(sm: int) -> bool:
        if pc[sm] >= total[sm] or sm in running:
            return False
        instr = program.instructions[sm, pc[sm] % lengths[sm]]
        step = pc[sm] // lengths[sm]
        for wc, wt in ((instr[W_WAIT0], instr[W_TARGET0]), (instr[W_WAIT1], instr[W_TARGET1])):
            if wc >= 0 and count[wc] < int(wt) * (step + 1):
                return False
        return True

    def start(sm: int) -> None:
        instr = program.instructions[sm, pc[sm] % lengths[sm]]
        step = pc[sm] // lengths[sm]
        pc[sm] += 1
        running[sm] = (instr, step)
        if on_start is not None:
            on_start(sm, instr, step)

    def finish(sm: int) -> None:
        instr, step = running.pop(sm)
        execute(instr, step, n_steps)
        if on_finish is not None:
            on_finish(sm, instr, step)
        sig = int(instr[W_SIGNAL])
        if sig >= 0 and signals(int(instr[W_OP]), step, n_steps):
            count[sig] += 1
            counters[sig] = count[sig]
            if on_counter is not None and count[sig] % int(targets[sig]) == 0:
                on_counter(sig, count[sig] // int(targets[sig]) - 1)

    while True:
        if rng is None:
            sm = next((s for s in range(num_sms) if ready(s)), None)
            if sm is None:
                break
            start(sm)
            finish(sm)
            continue
        startable = [s for s in range(num_sms) if ready(s)]
        events = [("start", s) for s in startable] + [("finish", s) for s in running]
        if not events:
            break
        kind, sm = events[int(rng.integers(len(events)))]
        (start if kind == "start" else finish)(sm)
    if any(pc[s] < total[s] for s in range(num_sms)):
        stuck = []
        for s in range(num_sms):
            if pc[s] < total[s]:
                instr = program.instructions[s, pc[s] % lengths[s]]
                step = pc[s] // lengths[s]
                waits = [(program.counter_names[int(c)], count[int(c)], int(t) * (step + 1))
                         for c, t in ((instr[W_WAIT0], instr[W_TARGET0]), (instr[W_WAIT1], instr[W_TARGET1]))
                         if c >= 0]
                stuck.append(f"SM {s} step {step} {OP_NAMES.get(int(instr[W_OP]), '?')} waits {waits}")
        raise DeadlockError("deadlock: " + "; ".join(stuck[:4]) + (" ..." if len(stuck) > 4 else ""))
