"""Diagnostic (not a `solo bench` report): checks that the bench's GGUF of a shape is the same model in llama.cpp.

`solo bench --compare llama.cpp` counts a peer only when its greedy tokens start as Solo's, but on random
weights at a real depth near-tied logits can part ways for reasons of precision alone (llama.cpp keeps
float32 activations on F16 weights and rounds them to bf16 on BF16 ones; Solo rounds where transformers
does). This compares prompt logits directly, on a copy of the shape with fewer layers and a smaller
vocabulary, in float32: Solo's eager model against llama.cpp on the GGUF the bench's writer makes of it (F32,
F16 or BF16 matrices). A wrong conversion (a norm offset, a RoPE table, a tensor layout) shows as
differences of the logits' own size; precision alone as small ones with the same argmax.

    python benchmarks/gguf_peer_logits.py --shape Gemma-3-1B --layers 6 --type F32 --type F16 --type BF16

Needs llama-cpp-python and gguf (the `llamacpp` extra). Random matrices N(0, 0.02^2), norm weights N(0, 0.3^2)
so that every norm's scale matters.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from solo.bench.peers.llamacpp import write_gguf
from solo.bench.shapes import SHAPES
from solo.model.config import ModelConfig
from solo.model.rope import RotaryEmbedding
from solo.model.transformer import KVCache, Transformer


def main() -> None:
    """Build the reduced shape, write each GGUF type and print max |logit difference| and argmax agreement."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--shape", default="Gemma-3-1B")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--prompt-len", type=int, default=137)
    ap.add_argument("--type", action="append", dest="types", choices=["F32", "F16", "BF16"])
    args = ap.parse_args()
    from llama_cpp import Llama

    config = ModelConfig.from_dict(dict(SHAPES[args.shape], num_hidden_layers=args.layers, vocab_size=args.vocab))
    torch.manual_seed(0)
    model = Transformer(config).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(0.0, 0.3 if "norm" in name else 0.02)
    model.rotary = RotaryEmbedding(config)
    model.eval()
    ids = list(range(3, 3 + args.prompt_len))
    cache = KVCache(config, 1, args.prompt_len, torch.float32)
    with torch.no_grad():
        ref = model(torch.tensor([ids]), torch.arange(len(ids)).view(1, -1), cache, torch.tensor([0]))[0]
    print(f"{args.shape} with {args.layers} layers, vocab {args.vocab}, {len(ids)} prompt ids; Solo eager float32 "
          f"logits up to {ref.abs().max().item():.3f} in size")
    with tempfile.TemporaryDirectory() as tmp:
        for type_name in args.types or ["F32"]:
            path = Path(tmp) / f"model-{type_name}.gguf"
            write_gguf(model, path, type_name)
            llm = Llama(str(path), n_ctx=len(ids), logits_all=True, verbose=False)
            llm.eval(ids)
            theirs = torch.tensor(np.array(llm.scores[:len(ids)]))
            diff = (theirs - ref).abs().max(dim=-1).values
            agree = (theirs.argmax(-1) == ref.argmax(-1)).float().mean().item()
            print(f"  llama.cpp {type_name:4}: max |logit difference| {diff.max().item():.4f} (median over positions "
                  f"{diff.median().item():.4f}), argmax equal at {agree:.0%} of the positions")
            del llm


if __name__ == "__main__":
    main()
