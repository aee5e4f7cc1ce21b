"""Fused Triton kernels for single-request (batch 1) decode on CUDA GPUs.

One module per fused operation, each holding its kernel and a thin wrapper that checks shapes, allocates,
sets the grid and launches; benchmarks run only under the module's `__main__`:

    common.py        device helpers shared by the kernels (RMSNorm statistics, normalized input chunks)
    gemv.py          split-K matrix-vector product with bias / residual epilogues
    rmsnorm_gemv.py  RMSNorm fused into the following matrix-vector product (LM head)
    qkv_rope.py      RMSNorm + fused QKV projection + RoPE + KV-cache write
    attention.py     flash-decoding attention split over the KV length (GQA, sliding window, softcap)
    swiglu.py        RMSNorm + gate/up projection + activation (SwiGLU / GeGLU)
    sampling.py      argmax and Gumbel-max sampling over logits, with on-device stop-token bookkeeping
    tuning.py        launch-configuration search and its cache
    benchtools.py    timing helpers for the kernels' benchmarks (HBM probe, L2-rotating graph timing)

Triton is an optional dependency (`pip install triton`, the `gpu` extra): nothing here is imported by `import solo`.
Every kernel also runs under the Triton interpreter (`TRITON_INTERPRET=1`, set before Triton is imported),
which is how the CPU tests check them against the torch reference.
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    """True when the `triton` package can be imported (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None
