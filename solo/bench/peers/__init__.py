"""Peers `solo bench --compare` runs on the same shape, weights, prompt and output length as Solo.

Every peer is optional: `load_peers` turns a missing package or a failed build into a `PeerSkipped`
with a one-line reason, and the benchmark goes on without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from solo.model.transformer import Transformer

PEER_NAMES = ("hf", "hf-eager", "hf-compile", "llama.cpp")
"""Names accepted by `--compare` ("hf" means both transformers variants; "llama.cpp-<GGUF type>", e.g.
llama.cpp-BF16, runs one GGUF type of llama.cpp only)."""

LLAMACPP_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0")
"""GGUF weight types a "llama.cpp-<type>" peer name may give."""


class PeerSkipped(Exception):
    """A peer cannot run here; the message says why (printed as "peer skipped: <reason>")."""


@dataclass
class RunResult:
    """One timed generation.

    Attributes:
        ttft_s: prompt in to first token chosen, in seconds.
        decode_s: time of the remaining tokens, in seconds.
        decode_tokens: tokens generated after the first.
        host_syncs: host synchronisations counted by the runtime during decode, or None.
        cached_tokens: prompt tokens the peer reused from its previous run instead of prefilling them.
    """

    ttft_s: float
    decode_s: float
    decode_tokens: int
    host_syncs: int | None = None
    cached_tokens: int = 0

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode speed of this run."""
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else float("nan")


@dataclass
class PeerSpec:
    """What a peer is built from.

    Attributes:
        model: Solo's eager model holding the weights (peers share or convert these tensors).
        raw_config: the config.json fields of the model (for building a transformers model).
        dtype: weight dtype.
        quantize: None, "int8" or "int4" (Solo's setting; peers pick their closest format).
        device: where to run.
        threads: CPU threads.
        max_seq: longest prompt + generation the peer must hold.
    """

    model: Transformer
    raw_config: dict[str, Any]
    dtype: torch.dtype
    quantize: str | None
    device: torch.device
    threads: int
    max_seq: int
    extra: dict[str, Any] = field(default_factory=dict)


class Peer(Protocol):
    """A peer engine ready to generate.

    Attributes:
        name: the label in reports ("hf-eager", "llama.cpp").
        build_info: version, precision and build details, printed with its numbers.
    """

    name: str
    build_info: str

    def run(self, prompt_ids: list[int], gen_len: int) -> RunResult:
        """Greedy-generate `gen_len` tokens after `prompt_ids`, timing the first token and the rest."""
        ...

    def close(self) -> None:
        """Release the peer's memory and files."""
        ...


def expand_names(names: list[str]) -> list[str]:
    """`--compare` values to peer names ("hf" -> hf-eager, hf-compile).

    Raises:
        ValueError: an unknown name.
    """
    out: list[str] = []
    for name in names:
        name = name.strip()
        if not name:
            continue
        if name not in PEER_NAMES and name.removeprefix("llama.cpp-") not in LLAMACPP_TYPES:
            raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEER_NAMES)} or llama.cpp-<type> "
                             f"(type: {', '.join(LLAMACPP_TYPES)})")
        for peer in (("hf-eager", "hf-compile") if name == "hf" else (name,)):
            if peer not in out:
                out.append(peer)
    return out


def peer_variants(name: str, spec: PeerSpec) -> list[str]:
    """The engines one `--compare` name runs as.

    "llama.cpp" is one peer per matching GGUF type ("llama.cpp-F16" and "llama.cpp-BF16" for bf16 weights,
    "llama.cpp-Q8_0" for int8, ...); every other name (a single "llama.cpp-<type>" too) is one engine.
    """
    if name == "llama.cpp":
        from solo.bench.peers.llamacpp import gguf_type_names

        return [f"llama.cpp-{t}" for t in gguf_type_names(spec.dtype, spec.quantize)]
    return [name]


def load_peer(name: str, spec: PeerSpec) -> Peer:
    """Build one peer ("hf-eager", "hf-compile", "llama.cpp" or "llama.cpp-<GGUF type>").

    Raises:
        PeerSkipped: the peer's package is missing or it cannot run this model here.
    """
    if name in ("hf-eager", "hf-compile"):
        from solo.bench.peers.hf import HFPeer

        return HFPeer(spec, compiled=name == "hf-compile")
    if name == "llama.cpp" or name.startswith("llama.cpp-"):
        from solo.bench.peers.llamacpp import LlamaCppPeer

        return LlamaCppPeer(spec, name.removeprefix("llama.cpp").removeprefix("-") or None)
    raise PeerSkipped(f"unknown peer {name!r}")
