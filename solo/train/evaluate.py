"""Held-out evaluation: loss, bits per byte, and the ``xz -9e`` baseline on the same files.

Accounting (the same for every number this module reports):

* each file is encoded as ``[BOS] + tokens(text) + [EOS]``; BOS is given, never scored;
* every text token **and** the closing EOS is scored (EOS is the cost of knowing where the file
  ends, which a compressor pays too);
* files longer than the context are scored with overlapping windows of ``context`` tokens whose
  ends advance by ``stride``; each token is scored exactly once, in the window where it has the
  most left context (at least ``context - stride`` tokens once the file is past the first window);
* bits per byte = (summed negative log-likelihood in bits) / (UTF-8 bytes of the files' text).

The ``xz`` baseline compresses with Python's :mod:`lzma` at ``preset 9 | PRESET_EXTREME`` in the
``.xz`` container, which is what ``xz -9e`` writes. It is reported twice: each file compressed
on its own (like the model, which sees each file alone), and all files concatenated (lets xz
reuse matches across files, so it is the stricter baseline).
"""

from __future__ import annotations

import lzma
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

XZ_PRESET = 9 | lzma.PRESET_EXTREME


@dataclass
class HeldoutResult:
    """Totals of a held-out evaluation.

    Attributes:
        n_files: files evaluated.
        n_bytes: UTF-8 bytes of their text.
        n_tokens: scored tokens (text tokens + one EOS per file; BOS not counted).
        nll_nats: summed negative log-likelihood in nats.
        loss: mean NLL per scored token in nats (``nll_nats / n_tokens``).
        bits_per_byte: ``nll_nats / ln 2 / n_bytes``.
    """

    n_files: int
    n_bytes: int
    n_tokens: int
    nll_nats: float
    loss: float
    bits_per_byte: float

    def as_dict(self) -> dict[str, float | int]:
        """Return the fields as a JSON-serialisable dict."""
        return asdict(self)


def scoring_windows(n_tokens: int, context: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """Yield the windows that score a document of ``n_tokens`` ids (BOS at position 0).

    Args:
        n_tokens: document length including BOS and EOS (>= 2).
        context: model context length in tokens.
        stride: how far each window's end moves, ``1 <= stride < context`` (the token before the
            first scored target must be inside the window).

    Yields:
        ``(start, end, first_scored)``: the window is ``ids[start:end]`` and the targets at
        positions ``first_scored .. end - 1`` of the document are scored in it.

    Raises:
        ValueError: for an invalid stride or a document shorter than 2 tokens.
    """
    if not 1 <= stride < context:
        raise ValueError(f"stride must be in [1, context={context}), got {stride}")
    if n_tokens < 2:
        raise ValueError("a document has at least BOS and EOS")
    scored_to = 1  # position 0 (BOS) is never a target
    end = min(context, n_tokens)
    while True:
        start = max(0, end - context)
        yield start, end, scored_to
        if end == n_tokens:
            return
        scored_to = end
        end = min(end + stride, n_tokens)


@torch.no_grad()
def evaluate_documents(
    model: torch.nn.Module,
    docs: Sequence[list[int]],
    n_bytes: int,
    context: int,
    stride: int | None = None,
    batch_size: int = 8,
    device: torch.device | str = "cpu",
    autocast_dtype: torch.dtype | None = None,
    pad_id: int = 0,
) -> HeldoutResult:
    """Score tokenised documents with a causal LM under the accounting in the module docstring.

    Args:
        model: a causal LM whose ``forward(input_ids=[batch, seq] int64)`` returns ``.logits`` of
            shape ``[batch, seq, vocab]``; it is put in eval mode.
        docs: per document, ``[BOS] + tokens + [EOS]`` ids.
        n_bytes: total UTF-8 bytes of the documents' text (the bits-per-byte denominator).
        context: window length in tokens (at most the model's context).
        stride: window advance in tokens; defaults to ``context // 2``.
        batch_size: windows per forward pass.
        device: where to run.
        autocast_dtype: if set (e.g. ``torch.bfloat16``), run the forward pass under autocast.
        pad_id: id used to right-pad short windows (never scored; causal attention ignores it).

    Returns:
        A :class:`HeldoutResult`.

    Raises:
        ValueError: if ``docs`` is empty or ``n_bytes`` is not positive.
    """
    if not docs or n_bytes <= 0:
        raise ValueError("need at least one document and a positive byte count")
    stride = context // 2 if stride is None else stride
    was_training = model.training
    model.eval()
    device = torch.device(device)

    # (window ids, index of first scored target within the window's predictions)
    items: list[tuple[list[int], int]] = []
    for ids in docs:
        for start, end, first in scoring_windows(len(ids), context, stride):
            items.append((ids[start:end], first - start - 1))
    # Similar lengths together waste less padding; the sum does not depend on the order.
    items.sort(key=lambda it: len(it[0]))

    total_nll = 0.0
    total_tokens = 0
    for i in range(0, len(items), batch_size):
        group = items[i : i + batch_size]
        width = max(len(w) for w, _ in group)
        inputs = torch.full((len(group), width), pad_id, dtype=torch.long)
        targets = torch.full((len(group), width), -100, dtype=torch.long)
        for row, (window, first) in enumerate(group):
            inputs[row, : len(window)] = torch.tensor(window)
            # Prediction j is for window token j + 1; keep only the not-yet-scored ones.
            targets[row, first : len(window) - 1] = torch.tensor(window[first + 1 :])
        inputs, targets = inputs.to(device), targets.to(device)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            logits = model(input_ids=inputs, use_cache=False).logits
        nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
        total_nll += float(nll)
        total_tokens += int((targets != -100).sum())
    model.train(was_training)
    return HeldoutResult(
        n_files=len(docs),
        n_bytes=n_bytes,
        n_tokens=total_tokens,
        nll_nats=total_nll,
        loss=total_nll / total_tokens,
        bits_per_byte=total_nll / math.log(2) / n_bytes,
    )


def xz_bits_per_byte(texts: Sequence[str]) -> dict[str, float | int]:
    """Compress texts with ``xz -9e`` settings and report bits per byte.

    Args:
        texts: file contents; encoded as UTF-8.

    Returns:
        A dict with ``n_bytes`` (input bytes), ``per_file_compressed_bytes`` and
        ``per_file_bits_per_byte`` (each file its own .xz stream), and
        ``concatenated_compressed_bytes`` and ``concatenated_bits_per_byte`` (one stream of all
        files joined in the given order).

    Raises:
        ValueError: if the texts hold no bytes.
    """
    blobs = [t.encode("utf-8") for t in texts]
    n_bytes = sum(len(b) for b in blobs)
    if n_bytes == 0:
        raise ValueError("nothing to compress")
    per_file = sum(len(lzma.compress(b, format=lzma.FORMAT_XZ, preset=XZ_PRESET)) for b in blobs)
    joined = len(lzma.compress(b"".join(blobs), format=lzma.FORMAT_XZ, preset=XZ_PRESET))
    return {
        "n_bytes": n_bytes,
        "per_file_compressed_bytes": per_file,
        "per_file_bits_per_byte": 8 * per_file / n_bytes,
        "concatenated_compressed_bytes": joined,
        "concatenated_bits_per_byte": 8 * joined / n_bytes,
    }
