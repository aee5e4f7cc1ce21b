"""Timed runs of a Solo runtime, and the quality of a quantized runtime against its dense reference."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from solo.bench.peers import RunResult
from solo.runtime.base import DecodeRuntime, SamplingSpec, block_tail, runtime_block_size, runtime_capabilities


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SoloRunner:
    """Greedy generation on a runtime, timed like the engine's loop.

    Prefill, then one decode step per token with a host argmax, or, on runtimes with block decoding (the
    CUDA-graph runtime, the monokernel), K tokens per host sync as `Engine.run` decodes a greedy request
    there (`solo.engine.block_decoding`).

    Args:
        runtime: the runtime under test.
        name: label in reports.
    """

    def __init__(self, runtime: DecodeRuntime, name: str = "solo") -> None:
        self.runtime = runtime
        self.name = name
        isa = getattr(runtime, "isa", None)  # the CPU runtime's kernel ISA level
        self.build_info = f"backend {runtime.name}" + (f", {isa} kernels" if isa else "")
        self._token: int | None = None  # the last chosen token and its position, between begin and advance
        self._position = 0

    @torch.inference_mode()
    def run(self, prompt_ids: list[int], gen_len: int) -> RunResult:
        """Generate `gen_len` tokens greedily; TTFT covers prefill and choosing the first token.

        Returns:
            Times in seconds (`perf_counter`, device synchronised), decode tokens (gen_len - 1) and the
            runtime's host syncs during decode (None when it does not count them).
        """
        ttft_s = self.begin(prompt_ids, gen_len)
        syncs_before = getattr(self.runtime, "host_syncs", None)
        decode_s = self.advance(gen_len - 1)
        syncs = None
        if syncs_before is not None:
            syncs = int(self.runtime.host_syncs) - int(syncs_before)
        return RunResult(ttft_s=ttft_s, decode_s=decode_s, decode_tokens=gen_len - 1, host_syncs=syncs)

    @torch.inference_mode()
    def begin(self, prompt_ids: list[int], gen_len: int) -> float:
        """Prefill `prompt_ids` and choose the first token; `advance` then decodes after it.

        Args:
            prompt_ids: the prompt's token ids.
            gen_len: tokens this generation will hold in all (the cache is reserved for them).

        Returns:
            TTFT in seconds (prefill and the first greedy choice, device synchronised).
        """
        rt = self.runtime
        rt.reserve(1, len(prompt_ids) + gen_len + 1)
        ids = torch.tensor(prompt_ids, dtype=torch.long)
        _sync(rt.device)
        start = time.perf_counter()
        self._token = int(rt.prefill(0, ids).argmax())
        first = time.perf_counter()
        self._position = len(prompt_ids)
        return first - start

    @torch.inference_mode()
    def advance(self, tokens: int) -> float:
        """Decode `tokens` more greedy tokens after `begin` / `begin_filled` (or the last `advance`).

        Returns:
            Seconds for the `tokens` decode steps, each followed by the greedy choice as the engine's loop
            makes it (one host sync per token, or per block of K tokens on block-decoding runtimes),
            device synchronised at the end.

        Raises:
            RuntimeError: no `begin` or `begin_filled` came first.
        """
        if self._token is None:
            raise RuntimeError("advance() needs begin() or begin_filled() first")
        rt = self.runtime
        row = torch.zeros(1, dtype=torch.long)
        token, position = self._token, self._position
        blocks = runtime_capabilities(rt).block_decoding and tokens > 0
        _sync(rt.device)
        start = time.perf_counter()
        if blocks:
            made = []
            for n, k in block_plan(tokens, self._block_size()):
                made += [t for block in rt.iter_blocks(0, token, position + len(made), SamplingSpec(), frozenset(),
                                                       n, k=k) for t in block]
                token = made[-1]
            if len(made) != tokens:
                raise RuntimeError(f"block decoding made {len(made)} tokens, not {tokens}")
            position += tokens
        for _ in range(0 if blocks else tokens):
            logits = rt.decode(row, torch.tensor([token]), torch.tensor([position]))
            token = int(logits[0].argmax())  # the engine's greedy choice syncs once per token too
            position += 1
        _sync(rt.device)
        elapsed = time.perf_counter() - start
        self._token, self._position = token, position
        return elapsed

    def _block_size(self) -> int:
        return runtime_block_size(self.runtime)

    @torch.inference_mode()
    def warm_up(self, prompt_ids: list[int], gen_len: int = 8, reserve_tokens: int | None = None) -> None:
        """Untimed work before timing: one generation (pages in the weights, builds kernels, allocates the cache).

        On a block-decoding runtime also one block of every K `block_plan` can use, so no graph is
        captured inside a timed run.

        Args:
            prompt_ids: a prompt to warm up with.
            gen_len: tokens it generates.
            reserve_tokens: the longest sequence the timed runs will hold, reserved first: a cache that
                grows later would do it inside a timed run (the CUDA-graph runtime rebuilds its step and
                recaptures its graphs then: `solo bench --device cuda` timed 541 tok/s that way on an H200
                whose steady state was 1056).
        """
        if reserve_tokens is not None:
            self.runtime.reserve(1, reserve_tokens)
        self.run(prompt_ids, gen_len)
        if not runtime_capabilities(self.runtime).block_decoding:
            return
        ks = sorted({k for n in range(1, self._block_size() + 1) for _, k in block_plan(n, self._block_size())})
        self.begin(prompt_ids, sum(ks) + 1)
        for k in ks:
            self.advance(k)

    @torch.inference_mode()
    def run_filled(self, context: int, gen_len: int, seed: int = 0) -> RunResult:
        """Decode `gen_len` tokens after a KV cache of `context` positions filled with random keys and values.

        For long-context decode speed without a long prefill (32k tokens of Qwen2.5-0.5B take many minutes
        of quadratic attention on a 2-core CPU): a decode step reads every cached key and value whatever
        they hold, so its time is that of a real context of the same length. Keys and values are standard
        normal, rounded to the cache's dtype. `ttft_s` is 0 (no prefill is timed).

        Raises:
            SoloError: the runtime keeps no host-visible KV cache (`cache.k` / `cache.v` per layer).
        """
        self.begin_filled(context, gen_len, seed)
        return RunResult(ttft_s=0.0, decode_s=self.advance(gen_len - 1), decode_tokens=gen_len - 1)

    @torch.inference_mode()
    def begin_filled(self, context: int, gen_len: int, seed: int = 0) -> None:
        """Fill the KV cache's first `context` positions with random keys and values (see `run_filled`).

        `advance` then decodes from position `context`. Nothing is timed.

        Raises:
            SoloError: the runtime keeps no host-visible KV cache (`cache.k` / `cache.v` per layer).
        """
        from solo.errors import SoloError

        rt = self.runtime
        rt.reserve(1, context + gen_len + 1)
        cache = getattr(rt, "cache", None)
        if cache is None or not getattr(cache, "k", None):
            raise SoloError(f"--sweep-fill random needs a runtime with a KV cache in memory (the cpu runtime), "
                            f"not {rt.name}")
        gen = torch.Generator(device="cpu").manual_seed(seed)
        for layer in (*cache.k, *cache.v):
            fill = torch.randn(layer[0, :, :context].shape, generator=gen)
            layer[0, :, :context].copy_(fill.to(layer.dtype))
        self._token, self._position = 3, context

    def close(self) -> None:
        """Nothing to release (the runtime belongs to the caller)."""


def block_plan(tokens: int, block_size: int) -> list[tuple[int, int]]:
    """How `SoloRunner.advance` decodes `tokens` on a block-decoding runtime: (tokens, K) per `iter_blocks`.

    Whole blocks of `block_size`, then the rest in powers of two (`solo.runtime.base.block_tail`, as the
    server's scheduler does): a short remainder (a `--lockstep` turn, the end of a run) is not padded to a
    whole block, and the Ks used stay few (each is one captured graph, warmed up before timing).

    Example: block_plan(37, 16) == [(32, 16), (4, 4), (1, 1)].
    """
    full = tokens - tokens % block_size
    plan = [(full, block_size)] if full else []
    rest = tokens - full
    while rest:
        k = block_tail(rest, block_size)
        plan.append((k, k))
        rest -= k
    return plan


@dataclass(frozen=True)
class QuantQuality:
    """How a quantized runtime's outputs compare with the dense one's.

    Attributes:
        steps: positions compared.
        top1_agreement: fraction of positions whose argmax agrees, both runtimes fed the dense
            runtime's greedy tokens (teacher forcing).
        greedy_prefix: tokens the two free-running greedy generations share before they first differ.
        mean_abs_logit_error: mean |logit_quant - logit_dense| over all positions and the vocabulary.
        max_abs_logit_error: the largest such difference.
        logit_std: standard deviation of the dense logits (the scale the errors compare with).
    """

    steps: int
    top1_agreement: float
    greedy_prefix: int
    mean_abs_logit_error: float
    max_abs_logit_error: float
    logit_std: float


@contextlib.contextmanager
def cpu_hog(processes: int) -> Iterator[None]:
    """Run `processes` busy-loop Python processes (no memory traffic, one core each) inside the block.

    The benchmark case for decode threads on a machine where other work holds cores: a spin barrier that
    never sleeps collapses when the OS preempts one of its threads (solo bench --cpu-hog).
    """
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        if hogs:
            time.sleep(0.2)  # let them start spinning before anything is timed
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


TOKEN_CHECK_LEN = 16
"""Greedy tokens each peer must reproduce from Solo's before its speed counts (`token_check`)."""


def token_check(solo_tokens: list[int], solo_first_top5: list[int], peer_tokens: list[int]) -> dict[str, Any]:
    """Compare a peer's greedy tokens with Solo's on the same prompt ids.

    Random-weight models have nearly flat logits (the top two often differ by ~0.1), so fp16, bf16 and
    fp32 engines part ways after a few tokens on near-ties even when both are right; a wrong conversion
    (RoPE layout, a missing bias) is wrong from the first token. The check passes when the peer's first
    token is among Solo's five most likely first tokens (chance: 5 in the vocabulary); the identical
    prefix is reported beside it.

    Args:
        solo_tokens: Solo's greedy tokens, [n].
        solo_first_top5: Solo's five most likely first tokens.
        peer_tokens: the peer's greedy tokens after the same prompt, [n].

    Returns:
        {"tokens": n, "identical_prefix": k, "first_in_solo_top5": bool, "passed": bool, "summary": str}.
    """
    prefix = 0
    for ours, theirs in zip(solo_tokens, peer_tokens, strict=False):
        if ours != theirs:
            break
        prefix += 1
    first_ok = bool(peer_tokens) and peer_tokens[0] in solo_first_top5
    n = len(solo_tokens)
    summary = f"identical for {prefix}/{n} tokens" + ("" if first_ok else ", first token not in Solo's top 5")
    return {"tokens": n, "identical_prefix": prefix, "first_in_solo_top5": first_ok, "passed": first_ok,
            "summary": summary}


@torch.inference_mode()
def greedy_tokens(rt: DecodeRuntime, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """`steps` greedy tokens after `prompt` on row 0 of `rt`, with the fp32 logits [vocab] of each step."""
    return _greedy(rt, prompt, steps)


def _greedy(rt: DecodeRuntime, prompt: list[int], steps: int, forced: list[int] | None = None
            ) -> tuple[list[int], list[torch.Tensor]]:
    rt.reserve(1, len(prompt) + steps + 1)
    logits = rt.prefill(0, torch.tensor(prompt, dtype=torch.long)).float().cpu()
    tokens, all_logits = [], [logits]
    row = torch.zeros(1, dtype=torch.long)
    for i in range(steps - 1):
        token = forced[i] if forced is not None else int(logits.argmax())
        tokens.append(int(logits.argmax()))
        logits = rt.decode(row, torch.tensor([token]), torch.tensor([len(prompt) + i]))[0].float().cpu()
        all_logits.append(logits)
    tokens.append(int(logits.argmax()))
    return tokens, all_logits


@torch.inference_mode()
def quant_quality(dense: DecodeRuntime, quant: DecodeRuntime, prompt: list[int], steps: int = 64) -> QuantQuality:
    """Compare a quantized runtime with the dense runtime over `steps` greedy positions.

    Args:
        dense: the unquantized (bf16) runtime, the reference.
        quant: the quantized runtime.
        prompt: prompt ids.
        steps: positions to compare (first token included).

    Returns:
        Agreement, shared greedy prefix and logit errors (see `QuantQuality`).
    """
    ref_tokens, ref_logits = _greedy(dense, prompt, steps)
    forced_tokens, forced_logits = _greedy(quant, prompt, steps, forced=ref_tokens)
    free_tokens, _ = _greedy(quant, prompt, steps)
    agree = sum(int(a == b) for a, b in zip(ref_tokens, forced_tokens, strict=True)) / steps
    prefix = 0
    for a, b in zip(ref_tokens, free_tokens, strict=True):
        if a != b:
            break
        prefix += 1
    diffs = torch.stack([(a - b).abs() for a, b in zip(ref_logits, forced_logits, strict=True)])
    spread = float(torch.stack(ref_logits).std())
    return QuantQuality(steps, agree, prefix, float(diffs.mean()), float(diffs.max()), spread)


@torch.inference_mode()
def time_outside_matmuls(runtime: DecodeRuntime, prompt: list[int], steps: int = 64) -> tuple[float, float] | None:
    """Seconds per decode token spent outside the weight-streaming matrix-vector products, and per whole step.

    Runs the same decode steps twice, back to back at the same context: whole, then with the products
    replaced by zero writes (`skip_matmuls`, which only the CPU runtime has). What remains in the second is
    the Python call, norms, RoPE, attention over the KV cache, barriers and the LM-head softcap. Measuring
    both under the same conditions keeps their ratio meaningful even when the machine's speed drifts.

    Returns:
        (outside_s, step_s) per token, or None for runtimes without that switch.
    """
    skip = getattr(runtime, "skip_matmuls", None)
    if skip is None:
        return None
    runtime.reserve(1, len(prompt) + steps + 1)
    row = torch.zeros(1, dtype=torch.long)

    def timed() -> float:
        runtime.prefill(0, torch.tensor(prompt, dtype=torch.long))
        start = time.perf_counter()
        for i in range(steps):
            logits = runtime.decode(row, torch.tensor([5]), torch.tensor([len(prompt) + i]))
            int(logits[0].argmax())
        return (time.perf_counter() - start) / steps

    step_s = timed()
    skip(True)
    try:
        outside_s = timed()
    finally:
        skip(False)
    return outside_s, step_s
