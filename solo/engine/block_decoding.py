"""The engine side of block decoding: stream a request's tokens as each block of K lands.

`Engine.run` calls `run_in_blocks` right after prefill when `can_run_in_blocks` says the runtime (its
`block_decoding` capability, `solo.runtime.base.BlockDecodingRuntime`) and the request allow it. The
loop then differs from the per-token loop only in where the next token is chosen:

- The first token is chosen on the host from the prefill logits (`Request.choose`), exactly as in the
  per-token loop (so TTFT and its logprob-free semantics are unchanged).
- The rest come from `runtime.iter_blocks`: sampled on the device (greedy: the same argmax, so the same
  tokens as per-token decoding; sampled: Philox-seeded by the request's seed, reproducible, but a
  different random stream from the host sampler's), with the stop-token check on the device.
- Every token still goes through `Request.append`, one event per token, in order: EOS, stop strings
  (host-side text, matched across token boundaries), max_tokens, the detokenizer and the timings behave
  as in the per-token loop. When a stop string completes inside a block, the request finishes at that
  token; the block's later tokens were computed on the device but are never reported or counted.
- Requests that need per-token host work fall back to the per-token loop: repetition / presence /
  frequency penalties (their counts live on the host) and logprobs (they need the full distribution).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from solo.errors import SoloError
from solo.runtime.base import SamplingSpec, runtime_capabilities


def can_run_in_blocks(runtime: Any, request: Any) -> bool:
    """True when `runtime` decodes in blocks and `request` needs no per-token host work."""
    return runtime_capabilities(runtime).block_decoding and not request.needs_host_logits


def run_in_blocks(runtime: Any, request: Any, logits: torch.Tensor, row: int = 0) -> Iterator[Any]:
    """Continue a request after prefill, block by block.

    Args:
        runtime: a runtime with `iter_blocks` (`CudaGraphRuntime`, `MegakernelRuntime`).
        request: the `solo.engine.request.Request`, prefilled into cache row `row`.
        logits: float32 [vocab] prefill logits of the last prompt position.
        row: the request's cache row.

    Yields:
        `GenerationEvent`s, one per token, as `Request.append` makes them; the last one finishes it.

    Raises:
        SoloError: the device ran out of blocks before the request finished (a cache too short for the
            prompt plus `max_new_tokens`).
    """
    # The host sampler's generator may live elsewhere than the logits (a CPU sampler for a GPU runtime).
    token, info = request.choose(logits.to(request.sampler.generator.device))
    event = request.append(token, info)
    yield event
    if request.finished:
        return
    blocks = runtime.iter_blocks(
        row, token, request.next_position - 1, SamplingSpec.from_resolved(request.sampling),
        frozenset(request.eos_ids), request.max_new_tokens - len(request.output_ids),
    )
    try:
        for tokens in blocks:
            for token in tokens:
                event = request.append(token)
                yield event
                if request.finished:
                    return
    finally:
        blocks.close()
    # The budget and the stop tokens given to the device end the request on its last token.
    raise SoloError("decode blocks ended before the request finished: was the KV cache reserved for "
                    "the prompt plus max_new_tokens?")
