"""Greedy decoding through a runtime's `prefill` / `decode`, shared by the CPU runtime tests."""

from __future__ import annotations

import torch


def greedy_steps(runtime, prompt: list[int], steps: int, forced: list[int] | None = None,
                 with_prefill: bool = False) -> tuple[list[int], torch.Tensor]:
    """Prefill `prompt` into row 0, then run `steps` decode steps.

    Each step feeds the argmax of the logits before it, or `forced[i]` (teacher forcing, so two runtimes stay on
    one path and every step's logits can be compared).

    Returns:
        (the `steps` argmax tokens, float32 logits [steps, vocab] of the decode steps, with the prefill's logits
        first ([steps + 1, vocab]) when `with_prefill`).
    """
    runtime.reserve(1, len(prompt) + steps + 1)
    logits = runtime.prefill(0, torch.tensor(prompt))
    tokens, history = [], [logits] if with_prefill else []
    for i in range(steps):
        tokens.append(int(logits.argmax()))
        token = tokens[-1] if forced is None else forced[i]
        logits = runtime.decode(torch.tensor([0]), torch.tensor([token]), torch.tensor([len(prompt) + i]))[0]
        history.append(logits)
    return tokens, torch.stack(history)


def scarce_huge_pages(monkeypatch, limit_bytes: int = 64 << 20) -> None:
    """Make the CPU runtime's huge-page mappings above `limit_bytes` fail as mmap does without memory (ENOMEM)."""
    import errno

    import solo.runtime.cpu as cpu

    real = cpu._huge_page_buffer

    def scarce(nbytes: int) -> torch.Tensor:
        if nbytes > limit_bytes:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real(nbytes)

    monkeypatch.setattr(cpu, "_huge_page_buffer", scarce)
