"""Shared helpers of the CUDA-runtime tests: tiny checkpoints, the eager greedy reference."""

from __future__ import annotations

from pathlib import Path

import torch
from checkpoints import make_checkpoint, make_longrope_checkpoint

from solo.model.config import ModelConfig
from solo.model.transformer import Transformer
from solo.model.weights import load_weights
from solo.runtime.eager import EagerRuntime

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "phi4", "smollm3")
LONGROPE = "phi3-longrope"  # a TinyCheckpoints name: Phi-3 with LongRoPE, loaded with its long context
PROMPT = [1, 5, 9, 33, 70, 2, 100, 7, 250, 31]


class TinyCheckpoints:
    """Writes each architecture's tiny checkpoint once per test session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folders: dict[str, Path] = {}

    def folder(self, arch: str) -> Path:
        if arch not in self.folders:
            if arch == LONGROPE:
                self.folders[arch] = make_longrope_checkpoint(self.root / arch)
            else:
                self.folders[arch] = make_checkpoint(self.root / arch, arch)
        return self.folders[arch]

    def model(self, arch: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Transformer:
        folder = self.folder(arch)
        config = ModelConfig.from_file(folder)
        if arch == LONGROPE:  # beyond the original context: the long factors and the attention factor
            config = config.with_context_length(128)
        return load_weights(folder, config, dtype, torch.device(device))


@torch.inference_mode()
def eager_greedy(model: Transformer, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and the logits each was chosen from (prefill first), from the eager runtime."""
    rt = EagerRuntime(model)
    rt.reserve(1, len(prompt) + steps + 1)
    logits = rt.prefill(0, torch.tensor(prompt))
    tokens, all_logits = [int(logits.argmax())], [logits.float().cpu()]
    for i in range(steps - 1):
        logits = rt.decode(torch.tensor([0]), torch.tensor([tokens[-1]]), torch.tensor([len(prompt) + i]))[0]
        all_logits.append(logits.float().cpu())
        tokens.append(int(logits.argmax()))
    return tokens, all_logits


@torch.inference_mode()
def runtime_greedy(rt, prompt: list[int], steps: int, mode: str, k: int = 4) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens from a CudaGraphRuntime, per token (`decode`) or by blocks (`iter_blocks`), and the
    logits of the prefill and of each per-token step."""
    from solo.runtime.cuda.state import SamplingSpec

    rt.reserve(1, len(prompt) + steps + 1)
    logits = rt.prefill(0, torch.tensor(prompt))
    tokens, all_logits = [int(logits.argmax())], [logits.float().cpu()]
    if mode == "block":
        for block in rt.iter_blocks(0, tokens[0], len(prompt), SamplingSpec(), frozenset(), steps - 1, k=k):
            tokens.extend(block)
        return tokens, all_logits
    for i in range(steps - 1):
        logits = rt.decode(torch.tensor([0]), torch.tensor([tokens[-1]]), torch.tensor([len(prompt) + i]))[0]
        all_logits.append(logits.float().cpu())
        tokens.append(int(logits.argmax()))
    return tokens, all_logits


def first_divergence(tokens: list[int], expected: list[int], expected_logits: list[torch.Tensor]) -> str | None:
    """None when the sequences agree; else a message with the reference's top-2 margin where they part.

    A margin near zero means the reference itself was a near-tie there (rounding picks either token).
    """
    for i, (a, b) in enumerate(zip(tokens, expected, strict=False)):
        if a != b:
            logits = expected_logits[i]
            margin = float(logits[b] - logits[a])
            return f"token {i}: got {a}, eager {b}; eager logit margin {margin:.3g}"
    if len(tokens) != len(expected):
        return f"lengths differ: {len(tokens)} vs {len(expected)}"
    return None


def scheduler_tokens(scheduler, requests) -> list[list[int]]:
    """Submit each request to a started `solo.server.scheduler.Scheduler` at once; every one's token ids."""
    import asyncio

    async def run():
        loop = asyncio.get_running_loop()
        gens = [scheduler.submit([r], loop) for r in requests]

        async def drain(g):
            return [t async for _, e in g.events() for t in e.token_ids]

        return await asyncio.gather(*(drain(g) for g in gens))

    return asyncio.run(run())


def record_block_sizes(rt) -> list[int]:
    """Wrap `rt.iter_blocks` to record the K of every call; returns the (live) list."""
    ks: list[int] = []
    iter_blocks = rt.iter_blocks

    def recording(*args, k=None, **kwargs):
        ks.append(k)
        return iter_blocks(*args, k=k, **kwargs)

    rt.iter_blocks = recording
    return ks
