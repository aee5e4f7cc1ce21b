"""Lowering of one Llama-family decode step to a task graph (tiles of the step's matrices and attention).

A decode step at batch 1 streams every weight once, so it is cut into tasks that each stream a tile of
one matrix (or one slice of the KV cache) and are small enough that every SM has work in every phase.
Each task waits on at most two counters ("the data I read is complete") and signals one counter when
its writes are done; no task waits for a whole-grid barrier. The stages of a step, per layer:

    QKV      RMSNorm(x0) -> rows of W_qkv -> RoPE (q and k) -> q buffer / KV-cache slot at `pos`
             (a tile covers `pairs` rotary pairs of one head: rows j..j+p and hd/2+j..hd/2+j+p, so
             RoPE's rotate-half partners are in the same task)            signals qkv[l][kv group]
    ATTN     split-KV partial attention of one KV group (its GQA query heads) over a slice of the
             keys: running max m, sum l and unnormalised output o, float32  signals part[l][g]
    MERGE    the partials of one group merged in a fixed order (log-sum-exp rescaling, as
             FlashDecoding, Dao et al. 2023) -> attn buffer             signals attn[l]
    OPROJ    rows of W_o: x1[r] = x0[r] + W_o[r] @ attn                signals oproj[l]
    GATE_UP  RMSNorm(x1) -> rows of gate and up -> silu(gate) * up -> h  signals gate_up[l]
    DOWN     rows of W_down: x0[r] = x1[r] + W_down[r] @ h              signals down[l]

then LM_HEAD (final RMSNorm + rows of the LM head -> float32 logits and a per-tile argmax, of the
logits or, with a temperature, of logits / T + Gumbel noise: `gumbel_noise`) and SAMPLE (the argmax
over tiles, the token ring, the stop check, the next position and the next token's
embedding into x0, signalling "embed" for the next step). EMBED (x0 = embedding of the state's token)
runs at step 0 of a launch only. Tasks read the device state (position, done flag) and skip their
work once a stop token was emitted, so later steps change nothing (they still signal).

Counters are never reset inside a launch: a wait at step s needs `target * (s + 1)` signals, where
`target` is the number of tasks that signal the counter in one step (the host zeroes the counters
before each launch). Every task of step s+1 depends on SAMPLE of step s, which depends on every task
of step s, so a count can only include step s+1's signals once step s's are all in.

The numerics follow the eager model (`solo.model.layers`): RMSNorm in float32, rounded to the
weights' dtype before the weight multiply; matrix products accumulate in float32 and round once to the
dtype; attention in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from solo.model.config import ModelConfig

# Opcodes of the instruction set (shared with kernel.cu: keep the numbers in sync).
OP_NOP = 0
OP_EMBED = 1
OP_QKV = 2
OP_ATTN = 3
OP_MERGE = 4
OP_OPROJ = 5
OP_GATE_UP = 6
OP_DOWN = 7
OP_LM_HEAD = 8
OP_SAMPLE = 9
OP_NAMES = {OP_NOP: "nop", OP_EMBED: "embed", OP_QKV: "qkv", OP_ATTN: "attn", OP_MERGE: "merge",
            OP_OPROJ: "oproj", OP_GATE_UP: "gate_up", OP_DOWN: "down", OP_LM_HEAD: "lm_head",
            OP_SAMPLE: "sample"}

# Device state words (int32), shared with kernel.cu.
STATE_POS = 0        # position of the token this step processes
STATE_TOKEN = 1      # the token this step processes
STATE_DONE = 2       # 1 once a stop token was emitted or the budget is spent
STATE_EMITTED = 3    # tokens written to the ring in this launch
STATE_BUDGET = 4     # tokens this launch may emit
STATE_NUM_STOP = 5   # how many stop ids follow
STATE_STOP = 6       # first of MAX_STOP_IDS stop ids
MAX_STOP_IDS = 10
STATE_TEMPERATURE = STATE_STOP + MAX_STOP_IDS  # float32 bits; 0 = greedy
STATE_SEED = STATE_TEMPERATURE + 1              # sampling seed (int32)
STATE_ERROR = STATE_SEED + 1                    # the kernel sets it when a counter wait timed out
STATE_WORDS = STATE_ERROR + 1


def megakernel_unsupported_reason(config: ModelConfig) -> str | None:
    """Why the monokernel's lowering cannot express `config` (one line), or None when it can.

    The lowering covers dense Llama-family decoders: pre-norm, SwiGLU MLP, RoPE without scaling that
    changes with the length, global attention, no biases, no q/k norm, no soft-capping.
    """
    checks = [
        (config.hidden_act == "silu", f"activation {config.hidden_act!r} (only silu)"),
        (not (config.qkv_bias or config.o_bias or config.mlp_bias), "projection biases"),
        (not config.qk_norm, "q/k RMSNorm (Qwen3)"),
        (not config.sandwich_norm and not config.norm_unit_offset, "Gemma-style norms"),
        (config.embedding_scale is None, "scaled embeddings"),
        (config.attn_logit_softcap is None and config.final_logit_softcap is None, "logit soft-capping"),
        (all(w is None for w in config.layer_sliding_windows), "sliding-window attention"),
        (config.rope.rope_type != "dynamic", "dynamic NTK RoPE"),
        (not config.layer_ropes, "per-layer RoPE (Gemma 3's local layers, SmolLM3's NoPE layers)"),
        (config.head_dim % 2 == 0, f"odd head_dim {config.head_dim}"),
    ]
    for ok, what in checks:
        if not ok:
            return f"the megakernel lowering does not support {what}"
    return None


@dataclass(frozen=True)
class Dims:
    """Model and tiling sizes the lowering, the VM and the kernel agree on.

    Attributes:
        hidden, inter, vocab, layers, heads, kv_heads, head_dim: model sizes (F = inter).
        eps: RMSNorm epsilon; attn_scale: softmax scale.
        max_seq: KV-cache slots per layer.
        qkv_pairs: rotary pairs per QKV tile (a tile has 2 * qkv_pairs rows of one head).
        o_rows, gu_rows, down_rows, lm_rows: output rows per tile of W_o, gate/up (each), W_down, LM head.
        splits: split-KV partials per KV group.
        elem_bytes: bytes per weight / activation element (2 for bf16).
    """

    hidden: int
    inter: int
    vocab: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    attn_scale: float
    max_seq: int
    qkv_pairs: int
    o_rows: int
    gu_rows: int
    down_rows: int
    lm_rows: int
    splits: int
    elem_bytes: int = 2

    @property
    def groups(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.heads // self.kv_heads

    @property
    def q_size(self) -> int:
        """Query width: heads * head_dim."""
        return self.heads * self.head_dim

    def n_tiles(self, rows: int, per_tile: int) -> int:
        """Tiles of `per_tile` rows covering `rows` (the last may be short)."""
        return -(-rows // per_tile)

    @property
    def lm_tiles(self) -> int:
        """Tiles of the LM head."""
        return self.n_tiles(self.vocab, self.lm_rows)


_TILE_OVERHEAD_BYTES = 8192  # an instruction's fixed cost in byte-equivalents (see schedule.py)


def _best_rows(rows: int, row_bytes: int, num_sms: int, tile_bytes: int, multiple: int = 1) -> int:
    """Rows per tile that balance `rows` over `num_sms` SMs (least work on the busiest SM).

    The busiest SM's work counts its rows' bytes and a fixed cost per tile; tiles stay within
    `tile_bytes`; ties go to bigger tiles (fewer instructions).
    """
    limit = max(multiple, (tile_bytes // max(row_bytes, 1)) // multiple * multiple)
    best, best_cost = multiple, None
    for r in range(multiple, min(limit, rows) + 1, multiple):
        tiles = -(-rows // r)
        waves = -(-tiles // num_sms)  # tiles on the busiest SM
        cost = waves * (r * row_bytes + _TILE_OVERHEAD_BYTES)
        if best_cost is None or cost <= best_cost:
            best, best_cost = r, cost
    return best


def plan_dims(config: ModelConfig, max_seq: int, num_sms: int = 132, elem_bytes: int = 2,
              tile_bytes: int = 64 * 1024) -> Dims:
    """Tile sizes for a model on a GPU with `num_sms` SMs.

    Args:
        config: a model config the lowering supports (see `megakernel_unsupported_reason`).
        max_seq: KV-cache slots per layer.
        num_sms: SMs (persistent CTAs): 132 on an H100 SXM / H200.
        elem_bytes: bytes per weight element (2 for bf16 / fp16, 4 for float32).
        tile_bytes: the most weight bytes one tile streams (it must fit one shared-memory prefetch stage).

    Returns:
        `Dims` whose tiles balance each stage over the SMs.
    """
    h, f, hd = config.hidden_size, config.intermediate_size, config.head_dim
    qkv_heads = config.num_heads + 2 * config.num_kv_heads
    # QKV tiles hold pairs of rows; aim for about one wave over all heads.
    pair_bytes = 2 * h * elem_bytes
    pairs = _best_rows(hd // 2 * qkv_heads, pair_bytes, num_sms, tile_bytes)
    pairs = max(1, min(pairs, hd // 2))
    while (hd // 2) % pairs:
        pairs -= 1  # tiles never straddle heads
    splits = max(1, min(64, num_sms // config.num_kv_heads))
    return Dims(
        hidden=h, inter=f, vocab=config.vocab_size, layers=config.num_layers, heads=config.num_heads,
        kv_heads=config.num_kv_heads, head_dim=hd, eps=config.rms_norm_eps, attn_scale=config.attn_scale,
        max_seq=max_seq, qkv_pairs=pairs,
        o_rows=_best_rows(h, config.num_heads * hd * elem_bytes, num_sms, tile_bytes),
        gu_rows=_best_rows(f, 2 * h * elem_bytes, num_sms, tile_bytes),
        down_rows=_best_rows(h, f * elem_bytes, num_sms, tile_bytes),
        lm_rows=_best_rows(config.vocab_size, h * elem_bytes, num_sms, tile_bytes),
        splits=splits, elem_bytes=elem_bytes,
    )


@dataclass
class Task:
    """One node of the step's task graph.

    Attributes:
        op: opcode (OP_*).
        layer: decoder layer (0 for the step-level ops).
        a, b: operands: QKV: fused head index and first pair; ATTN: group and split; MERGE: group;
            OPROJ/GATE_UP/DOWN/LM_HEAD: first row and row count (b); SAMPLE/EMBED: unused.
        c: QKV: pairs in the tile; LM_HEAD: tile index.
        waits: (counter id, signals per step) pairs this task waits for (at most two).
        signal: the counter it increments once its writes are done, or -1.
        cost_bytes: bytes it streams (weights, KV cache, activations), the scheduler's cost.
        stage: a readable name ("qkv", "attn", ...).
    """

    op: int
    layer: int
    a: int
    b: int
    c: int = 0
    waits: list[tuple[int, int]] = field(default_factory=list)
    signal: int = -1
    cost_bytes: int = 0
    stage: str = ""


@dataclass
class TaskGraph:
    """The lowered decode step.

    Attributes:
        dims: sizes and tiles.
        tasks: in a topological order (every task after the producers of the counters it waits on).
        counter_names: one name per counter id ("qkv[0][1]", "down[3]", ...).
        counter_targets: per counter, how many tasks signal it in one step.
    """

    dims: Dims
    tasks: list[Task]
    counter_names: list[str]
    counter_targets: list[int]


def lower_decode_step(dims: Dims, attn_len_estimate: int | None = None) -> TaskGraph:
    """Lower one decode step of a dense Llama-family model (see the module docstring).

    Args:
        dims: sizes and tiles from `plan_dims`.
        attn_len_estimate: the KV length the attention tasks' cost assumes (default: max_seq / 2).

    Returns:
        The `TaskGraph` of one step; its tasks end with SAMPLE. The step-0 EMBED task comes first.
    """
    d = dims
    eb = d.elem_bytes
    names: list[str] = []
    targets: list[int] = []

    def counter(name: str) -> int:
        names.append(name)
        targets.append(0)
        return len(names) - 1

    tasks: list[Task] = []

    def add(task: Task) -> None:
        if task.signal >= 0:
            targets[task.signal] += 1
        tasks.append(task)

    kv_len = attn_len_estimate or max(1, d.max_seq // 2)
    embed_done = counter("embed")
    add(Task(OP_EMBED, 0, 0, 0, signal=embed_done, cost_bytes=d.hidden * eb, stage="embed"))
    prev = embed_done
    half = d.head_dim // 2
    for layer in range(d.layers):
        qkv = [counter(f"qkv[{layer}][{g}]") for g in range(d.kv_heads)]
        part = [counter(f"part[{layer}][{g}]") for g in range(d.kv_heads)]
        attn = counter(f"attn[{layer}]")
        oproj = counter(f"oproj[{layer}]")
        gate_up = counter(f"gate_up[{layer}]")
        down = counter(f"down[{layer}]")
        wait_prev = [(prev, -1)]  # target filled in below, once every signaller is known
        for head in range(d.heads + 2 * d.kv_heads):
            if head < d.heads:
                group = head // d.groups
            elif head < d.heads + d.kv_heads:
                group = head - d.heads
            else:
                group = head - d.heads - d.kv_heads
            for j in range(0, half, d.qkv_pairs):
                pairs = min(d.qkv_pairs, half - j)
                add(Task(OP_QKV, layer, head, j, pairs, waits=list(wait_prev), signal=qkv[group],
                         cost_bytes=(2 * pairs + 1) * d.hidden * eb, stage="qkv"))
        for g in range(d.kv_heads):
            for s in range(d.splits):
                add(Task(OP_ATTN, layer, g, s, waits=[(qkv[g], -1)], signal=part[g],
                         cost_bytes=2 * -(-kv_len // d.splits) * d.head_dim * eb, stage="attn"))
        for g in range(d.kv_heads):
            add(Task(OP_MERGE, layer, g, 0, waits=[(part[g], -1)], signal=attn,
                     cost_bytes=d.splits * d.groups * (d.head_dim + 2) * 4, stage="merge"))
        for r in range(0, d.hidden, d.o_rows):
            n = min(d.o_rows, d.hidden - r)
            add(Task(OP_OPROJ, layer, r, n, waits=[(attn, -1)], signal=oproj,
                     cost_bytes=n * d.q_size * eb, stage="oproj"))
        for r in range(0, d.inter, d.gu_rows):
            n = min(d.gu_rows, d.inter - r)
            add(Task(OP_GATE_UP, layer, r, n, waits=[(oproj, -1)], signal=gate_up,
                     cost_bytes=(2 * n + 1) * d.hidden * eb, stage="gate_up"))
        for r in range(0, d.hidden, d.down_rows):
            n = min(d.down_rows, d.hidden - r)
            add(Task(OP_DOWN, layer, r, n, waits=[(gate_up, -1)], signal=down,
                     cost_bytes=n * d.inter * eb, stage="down"))
        prev = down
    lm = counter("lm_head")
    for t, r in enumerate(range(0, d.vocab, d.lm_rows)):
        n = min(d.lm_rows, d.vocab - r)
        add(Task(OP_LM_HEAD, 0, r, n, t, waits=[(prev, -1)], signal=lm,
                 cost_bytes=(n + 1) * d.hidden * eb, stage="lm_head"))
    # SAMPLE writes the next step's x0, so layer 0's QKV of the next step waits on "embed" (EMBED
    # signals it at step 0; SAMPLE counts for the later steps: one signal per step either way).
    add(Task(OP_SAMPLE, 0, 0, 0, waits=[(lm, -1)], signal=embed_done,
             cost_bytes=d.lm_tiles * 8 + d.hidden * eb, stage="sample"))
    targets[embed_done] = 1  # EMBED runs at step 0 only; SAMPLE signals for steps 1.. (not after the last)
    for task in tasks:
        task.waits = [(c, targets[c]) for c, _ in task.waits]
    return TaskGraph(dims=d, tasks=tasks, counter_names=names, counter_targets=targets)


def gumbel_noise(seed: int, pos: int, token_ids: torch.Tensor) -> torch.Tensor:
    """The kernel's Gumbel noise for `token_ids` at position `pos`: float32, same shape.

    A counter-based hash of (seed, pos, id) (lowbias32 by C. Wellons) mapped to a uniform u in (0, 1),
    then -log(-log(u)). With it, argmax(logits / T + noise) samples softmax(logits / T) (the Gumbel-max
    trick: Gumbel 1954; Maddison, Tarlow and Minka 2014), reproducibly for a seed and position.
    """
    mask = 0xFFFFFFFF
    x = (seed * 0x9E3779B1 + pos * 0x85EBCA77) & mask
    x = (x + token_ids.to(torch.int64) * 0xC2B2AE3D) & mask
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & mask
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & mask
    x = x ^ (x >> 16)
    u = ((x >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)
    return -torch.log(-torch.log(u))


def weight_bytes_per_step(dims: Dims) -> int:
    """Weight bytes one decode step streams: every matrix once and one embedding row (the roofline's numerator)."""
    d = dims
    per_layer = (d.q_size + 2 * d.kv_heads * d.head_dim) * d.hidden + d.hidden * d.q_size
    per_layer += 3 * d.hidden * d.inter + 2 * d.hidden
    return (d.layers * per_layer + d.vocab * d.hidden + 2 * d.hidden) * d.elem_bytes


def split_range(kv_len: int, splits: int, split: int) -> tuple[int, int]:
    """Key slots [lo, hi) of split `split` when `kv_len` keys are cut into `splits` near-equal parts.

    The kernel computes the same bounds from the device's position.
    """
    chunk = -(-kv_len // splits)
    lo = min(kv_len, split * chunk)
    return lo, min(kv_len, lo + chunk)


def attention_scale_log2(dims: Dims) -> float:
    """The softmax scale times log2(e): the kernel's exp2-based softmax multiplies scores by this."""
    return dims.attn_scale * math.log2(math.e)
