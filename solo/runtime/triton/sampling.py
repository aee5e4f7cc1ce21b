"""Next-token choice on the device: argmax, temperature / top-k / top-p / min-p sampling, stop tokens.

Sampling uses the Gumbel-max trick: argmax_i(l_i / T + G_i) with G_i = -log(-log(U_i)), U_i uniform,
is an exact draw from softmax(l / T) (Gumbel 1954; Maddison et al. 2014). So greedy decoding and
sampling are the same two-stage reduction over the vocabulary, with no normalisation pass:

    for each vocabulary block in parallel:                # grid = cdiv(V, BLOCK_V)
        s = l / T + G        (greedy: s = l; filtered: s = -inf where l / T < threshold)
        partial[block] = (max s, its index)               # ties: lowest index, as torch.argmax
    finalize (one CTA): token = argmax over partials; then the decode-state bookkeeping:
        active = not done and count < limit
        out[slot] = token if active else -1
        if active: next token = token, position += 1, count += 1, done = token is a stop token

U comes from Philox (Salmon et al. 2011, `tl.rand`) keyed by (seed + position of the fed token) and
counted by vocabulary index: a run is reproducible from its seed, whatever the block size.

Top-k, top-p (Holtzman et al. 2019) and min-p (Nguyen et al. 2024) become one threshold on l / T,
computed by `filter_threshold` with graph-capturable torch ops (a sort of the vocabulary), in the order
`solo.engine.sampling.TokenSampler` applies them: top-k, then top-p over what top-k kept, then min-p.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from solo.runtime.cuda import state as st
from solo.runtime.cuda.state import MODE_FILTERED, MODE_GREEDY, MODE_SAMPLE
from solo.runtime.triton.common import (
    PARAM_TEMPERATURE,
    PDL_OFF,
    STATE_COUNT,
    STATE_DONE,
    STATE_LIMIT,
    STATE_POS,
    STATE_SEED,
    STATE_TOKEN,
    launch_options,
    next_power_of_2,
    pdl_mode,
    pdl_release,
    pdl_wait,
)

__all__ = ["MODE_FILTERED", "MODE_GREEDY", "MODE_SAMPLE", "SamplerPlan", "argmax", "filter_threshold",
           "sample_step"]


class SamplerPlan:
    """Vocabulary split and the scratch buffers of the partial maxima.

    Args:
        vocab_size: logits width.
        device: where the buffers live.
        block_v: vocabulary entries per CTA of the first stage.

    Attributes:
        part_val: float32 [num_parts], each block's best score.
        part_idx: int64 [num_parts], its vocabulary index.
    """

    def __init__(self, vocab_size: int, device: torch.device | str, block_v: int = 2048) -> None:
        self.vocab_size = vocab_size
        self.block_v = min(block_v, next_power_of_2(vocab_size))
        self.num_parts = triton.cdiv(vocab_size, self.block_v)
        self.part_val = torch.empty(self.num_parts, dtype=torch.float32, device=device)
        self.part_idx = torch.empty(self.num_parts, dtype=torch.int64, device=device)


@triton.jit
def sample_partial_kernel(
    logits_ptr, state_ptr, params_ptr, threshold_ptr, part_val_ptr, part_idx_ptr, V,
    MODE: tl.constexpr, BLOCK_V: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Stage 1: best (score, index) of one vocabulary block; grid (cdiv(V, BLOCK_V),)."""
    pdl_wait(USE_PDL)
    pid = tl.program_id(0)
    idx = pid * BLOCK_V + tl.arange(0, BLOCK_V)
    in_vocab = idx < V
    x = tl.load(logits_ptr + idx, mask=in_vocab, other=float("-inf")).to(tl.float32)
    if MODE == 0:
        score = x
    else:
        # Exact division, as torch divides when the filter threshold is computed.
        s = tl.div_rn(x, tl.load(params_ptr + PARAM_TEMPERATURE))
        key = tl.load(state_ptr + STATE_SEED) + tl.load(state_ptr + STATE_POS)
        u = tl.rand(key, idx)
        gumbel = -tl.log(-tl.log(u))
        keep = in_vocab
        if MODE == 2:
            keep = keep & (s >= tl.load(threshold_ptr))
        score = tl.where(keep, s + gumbel, float("-inf"))
    best, best_idx = tl.max(score, axis=0, return_indices=True, return_indices_tie_break_left=True)
    pdl_release(USE_PDL)
    tl.store(part_val_ptr + pid, best)
    tl.store(part_idx_ptr + pid, (pid * BLOCK_V + best_idx).to(tl.int64))


@triton.jit
def sample_finalize_kernel(
    part_val_ptr, part_idx_ptr, state_ptr, stop_mask_ptr, out_ptr, slot, num_parts,
    UPDATE_STATE: tl.constexpr, BLOCK_P: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Stage 2: the token, and (with UPDATE_STATE) the decode-state step; grid (1,)."""
    pdl_wait(USE_PDL)
    i = tl.arange(0, BLOCK_P)
    valid = i < num_parts
    vals = tl.load(part_val_ptr + i, mask=valid, other=float("-inf"))
    idxs = tl.load(part_idx_ptr + i, mask=valid, other=0)
    # Blocks are in vocabulary order, so the first best block holds the lowest best index.
    best = tl.argmax(vals, axis=0, tie_break_left=True)
    token = tl.sum(tl.where(i == best, idxs, 0), axis=0)
    pdl_release(USE_PDL)
    if UPDATE_STATE:
        done = tl.load(state_ptr + STATE_DONE)
        count = tl.load(state_ptr + STATE_COUNT)
        active = (done == 0) & (count < tl.load(state_ptr + STATE_LIMIT))
        tl.store(out_ptr + slot, tl.where(active, token, -1))
        is_stop = tl.load(stop_mask_ptr + token) != 0
        tl.store(state_ptr + STATE_TOKEN, token, mask=active)
        tl.store(state_ptr + STATE_POS, tl.load(state_ptr + STATE_POS) + 1, mask=active)
        tl.store(state_ptr + STATE_COUNT, count + 1, mask=active)
        tl.store(state_ptr + STATE_DONE, is_stop.to(tl.int64), mask=active)
    else:
        tl.store(out_ptr + slot, token)


def filter_threshold(logits: torch.Tensor, state: torch.Tensor, params: torch.Tensor,
                     out: torch.Tensor) -> torch.Tensor:
    """The smallest l / T that top-k, top-p and min-p keep (graph-capturable torch ops, no sync).

    Top-p: Holtzman et al. 2019; min-p: Nguyen et al. 2024 (threshold max(l / T) + log(min_p), i.e.
    p >= min_p * p_max); same semantics as `solo.engine.sampling.TokenSampler.process`.

    Args:
        logits: float32 [V].
        state: int64 decode state [STATE_SIZE] (top-k read from its top-k slot; 0 disables it).
        params: float32 [PARAM_SIZE] sampling parameters (temperature > 0, top-p in (0, 1], min-p in [0, 1]).
        out: float32 [1] receives the threshold.

    Returns:
        `out`.
    """
    vocab = logits.numel()
    scaled = logits / params[st.PARAM_TEMPERATURE]
    ordered = torch.sort(scaled, descending=True).values
    top_k = state[st.STATE_TOP_K]
    k_eff = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    in_top_k = torch.arange(vocab, device=logits.device) < k_eff
    probs = torch.softmax(ordered.masked_fill(~in_top_k, float("-inf")), dim=0)
    mass_before = torch.cumsum(probs, dim=0) - probs
    top_p = params[st.PARAM_TOP_P]
    # Top-p keeps the tokens whose more likely predecessors hold less than top_p of the mass: a prefix.
    keep = in_top_k & ((mass_before < top_p) | (top_p >= 1.0))
    last_kept = keep.sum().clamp(min=1) - 1
    threshold = ordered.gather(0, last_kept.view(1))
    min_p_threshold = ordered[0] + torch.log(params[st.PARAM_MIN_P])
    return out.copy_(torch.maximum(threshold, min_p_threshold.view(1)))


def sample_step(
    logits: torch.Tensor,
    state: torch.Tensor,
    params: torch.Tensor,
    threshold: torch.Tensor,
    stop_mask: torch.Tensor,
    out_tokens: torch.Tensor,
    slot: int,
    mode: int,
    plan: SamplerPlan,
    pdl: bool = False,
) -> None:
    """Choose the next token from `logits` and advance the decode state (two launches; no host sync).

    Args:
        logits: float32 [V].
        state: int64 decode state, updated in place (see the module docstring).
        params: float32 sampling parameters (`solo.runtime.cuda.state.PARAM_*`).
        threshold: float32 [1] from `filter_threshold` (read in MODE_FILTERED only).
        stop_mask: int8/bool [V], nonzero for stop tokens.
        out_tokens: int64 [k] block output; `out_tokens[slot]` gets the token or -1 when inactive.
        slot: index into `out_tokens`.
        mode: MODE_GREEDY, MODE_SAMPLE or MODE_FILTERED.
        plan: vocabulary split and scratch.
        pdl: launch with programmatic dependent launch (Hopper; see `common.pdl_wait`).

    Raises:
        ValueError: logits are not float32 [plan.vocab_size].
    """
    if logits.shape != (plan.vocab_size,) or logits.dtype != torch.float32:
        raise ValueError(f"logits must be float32 [{plan.vocab_size}]")
    sample_partial_kernel[(plan.num_parts,)](
        logits, state, params, threshold, plan.part_val, plan.part_idx, plan.vocab_size,
        MODE=mode, BLOCK_V=plan.block_v, USE_PDL=pdl_mode(pdl),
        **launch_options(8 if plan.block_v >= 2048 else 4, 1, pdl),
    )
    sample_finalize_kernel[(1,)](
        plan.part_val, plan.part_idx, state, stop_mask, out_tokens, slot, plan.num_parts,
        UPDATE_STATE=True, BLOCK_P=next_power_of_2(plan.num_parts), USE_PDL=pdl_mode(pdl), **launch_options(4, 1, pdl),
    )


def argmax(logits: torch.Tensor, plan: SamplerPlan | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Index of the largest logit (the lowest one on ties, as torch.argmax), on the device.

    Args:
        logits: float32 [V].
        plan: scratch (default: allocated here).
        out: int64 [1] result (default: new).

    Returns:
        int64 [1].
    """
    plan = plan or SamplerPlan(logits.numel(), logits.device)
    out = out if out is not None else torch.empty(1, dtype=torch.int64, device=logits.device)
    sample_partial_kernel[(plan.num_parts,)](
        logits, out, logits, logits, plan.part_val, plan.part_idx, plan.vocab_size,
        MODE=MODE_GREEDY, BLOCK_V=plan.block_v, USE_PDL=PDL_OFF,
    )
    sample_finalize_kernel[(1,)](
        plan.part_val, plan.part_idx, out, out, out, 0, plan.num_parts,
        UPDATE_STATE=False, BLOCK_P=next_power_of_2(plan.num_parts), USE_PDL=PDL_OFF,
    )
    return out


if __name__ == "__main__":
    from solo.runtime.triton.benchtools import sampling_benchmark_main

    sampling_benchmark_main()
