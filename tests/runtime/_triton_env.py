"""Where the Triton kernel tests run: compiled on a CUDA GPU, else in Triton's CPU interpreter.

Import this before anything that imports Triton kernels: the interpreter is chosen by TRITON_INTERPRET
when a kernel is decorated, i.e. when its module is first imported.
"""

from __future__ import annotations

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = torch.device("cuda" if ON_GPU else "cpu")

requires_triton = pytest.mark.skipif(
    __import__("importlib").util.find_spec("triton") is None, reason="triton is not installed (pip install solo[gpu])"
)


def bf16_close(actual: torch.Tensor, expected: torch.Tensor, ulps: float = 2.0) -> None:
    """Assert bf16 results agree within `ulps` units in the last place of the larger magnitude.

    Values far below the tensor's scale (|x| < 1e-3 max|x|) may differ by 1e-5 max|x| instead: their ulp
    is meaningless next to the rounding of the sums that produced them.
    """
    a, e = actual.detach().double(), expected.detach().double()
    scale = torch.maximum(a.abs(), e.abs()).clamp(min=1e-30)
    ulp = torch.exp2(torch.floor(torch.log2(scale)) - 7)
    floor = 1e-5 * float(e.abs().max())
    bad = (a - e).abs() > ulps * ulp + floor
    assert not bad.any(), f"{int(bad.sum())} elements differ by more than {ulps} ulp; worst {(a - e).abs().max():.3g}"
