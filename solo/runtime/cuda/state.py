"""The decode state a captured step reads and writes on the device, and how the host fills it.

A CUDA graph bakes in tensor addresses, not values, so everything that changes between replays (the
token fed, its position, the cache row, the sampling parameters, the stop tokens, the block's output)
lives in fixed device tensors. The slot layout is defined here, once; the Triton kernels read it through
`solo.runtime.triton.common`. This module imports no Triton.
"""

from __future__ import annotations

import torch

# The sampling contract of block decoding lives with the other runtime capabilities (re-exported here).
from solo.runtime.base import MODE_FILTERED as MODE_FILTERED
from solo.runtime.base import MODE_GREEDY as MODE_GREEDY
from solo.runtime.base import MODE_SAMPLE as MODE_SAMPLE
from solo.runtime.base import SamplingSpec as SamplingSpec

STATE_TOKEN = 0
STATE_POS = 1
STATE_ROW = 2
STATE_COUNT = 3
STATE_LIMIT = 4
STATE_DONE = 5
STATE_SEED = 6
STATE_TOP_K = 7
STATE_SIZE = 8

PARAM_TEMPERATURE = 0
PARAM_TOP_P = 1
PARAM_MIN_P = 2
PARAM_SIZE = 4

class DecodeState:
    """Device tensors of the decode state, and the host's pinned mirrors for reading it back.

    Args:
        vocab_size: logits width (size of `stop_mask`).
        max_block: the most tokens one block may produce (size of `out_tokens`).
        device: where the tensors live.

    Attributes:
        io: int64 [STATE_SIZE + max_block] on the device: the state, then the block's output tokens
            (one tensor so one copy brings both back).
        state: view io[:STATE_SIZE].
        out_tokens: view io[STATE_SIZE:], -1 where a step was inactive.
        params: float32 [PARAM_SIZE] sampling parameters.
        threshold: float32 [1], the filter threshold of MODE_FILTERED.
        stop_mask: int8 [vocab], 1 for stop tokens.
    """

    def __init__(self, vocab_size: int, max_block: int, device: torch.device) -> None:
        self.device = device
        self.max_block = max_block
        self.io = torch.zeros(STATE_SIZE + max_block, dtype=torch.int64, device=device)
        self.state = self.io[:STATE_SIZE]
        self.out_tokens = self.io[STATE_SIZE:]
        self.params = torch.zeros(PARAM_SIZE, dtype=torch.float32, device=device)
        self.params[PARAM_TEMPERATURE] = 1.0
        self.params[PARAM_TOP_P] = 1.0
        self.threshold = torch.zeros(1, dtype=torch.float32, device=device)
        self.stop_mask = torch.zeros(vocab_size, dtype=torch.int8, device=device)
        self._stop_ids: frozenset[int] | None = None

    def _upload(self, dst: torch.Tensor, values: torch.Tensor) -> None:
        # Pinned staging makes the copy asynchronous (no wait on queued work); PyTorch's pinned
        # allocator keeps a block until its copy has run, so a new staging tensor per upload is safe.
        if self.device.type == "cuda":
            values = values.pin_memory()
        dst.copy_(values, non_blocking=True)

    def set_step(self, token: int, position: int, row: int) -> None:
        """Token id, its position (tokens) and cache row for a single forward step (no sampling); asynchronous."""
        self._upload(self.state[:3], torch.tensor([token, position, row], dtype=torch.int64))

    def start(self, token: int, position: int, row: int, limit: int, sampling: SamplingSpec,
              stop_ids: frozenset[int]) -> None:
        """Reset the state for a run of block steps.

        Args:
            token, position, row: the token to feed first, its position, the cache row.
            limit: the most tokens to generate in this run.
            sampling: sampling values.
            stop_ids: tokens that end the run (reported, then nothing more).
        """
        values = [0] * STATE_SIZE
        values[STATE_TOKEN], values[STATE_POS], values[STATE_ROW] = token, position, row
        values[STATE_LIMIT] = limit
        values[STATE_SEED] = sampling.seed % (1 << 62)
        values[STATE_TOP_K] = sampling.top_k
        self._upload(self.state, torch.tensor(values, dtype=torch.int64))
        params = [0.0] * PARAM_SIZE
        params[PARAM_TEMPERATURE] = sampling.temperature if sampling.temperature > 0 else 1.0
        params[PARAM_TOP_P] = sampling.top_p
        params[PARAM_MIN_P] = sampling.min_p if sampling.min_p > 0 else 0.0
        self._upload(self.params, torch.tensor(params, dtype=torch.float32))
        if stop_ids != self._stop_ids:
            mask = torch.zeros(self.stop_mask.numel(), dtype=torch.int8)
            ids = [t for t in stop_ids if 0 <= t < mask.numel()]
            if ids:
                mask[torch.tensor(ids)] = 1
            self._upload(self.stop_mask, mask)
            self._stop_ids = stop_ids

    def park(self, scratch_row: int) -> None:
        """Point the state at the scratch row with a zero limit, so a warm-up run changes nothing real."""
        values = [0] * STATE_SIZE
        values[STATE_ROW] = scratch_row
        self._upload(self.state, torch.tensor(values, dtype=torch.int64))
