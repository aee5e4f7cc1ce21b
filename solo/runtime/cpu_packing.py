"""bf16 weights packed for the CPU kernels' avx512-bf16 and amx levels (cpu_kernels/packed.h, format W_BF16_AMX).

Decode uses AVX512-BF16 instructions arranged to give exactly the AMX tile's bits; the span prefill
multiplies on tiles where the CPU has AMX, else as outer products over the packed rows (so a token's logits
do not depend on whether it was part of a prompt or a decode step). All read this layout: per 16-row group
and k step of 32 columns, 1 KiB of 16 vectors, E and O vectors alternating (the rows' even and odd
elements), each 32-bit lane one row's [k + 2, k] pair of them (packed.h explains why).

`AmxPackedLinear` stands in for an `nn.Linear` whose weight the CPU runtime packed: the eager model keeps
working (its weight is unpacked on access), while the weights exist once in memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

GROUP_ROWS = 16
"""Rows per packed group."""
STEP_COLS = 32
"""Columns per packed k step."""


def packed_shape(rows: int, cols: int) -> tuple[int, int, int]:
    """[groups, k steps, 512] of the packed layout of a [rows, cols] matrix (rows and cols zero-padded)."""
    return (-(-rows // GROUP_ROWS), -(-cols // STEP_COLS), GROUP_ROWS * STEP_COLS)


def pack_bf16_amx(weight: torch.Tensor) -> torch.Tensor:
    """Pack a bf16 weight for the AMX level's kernels.

    Args:
        weight: bfloat16 [rows, cols].

    Returns:
        bfloat16 [ceil(rows / 16), ceil(cols / 32), 512], contiguous: element (g, s, (v * 16 + n) * 2 + h)
        is weight[16 g + n, 32 s + 4 (v // 2) + 2 (1 - h) + v % 2] (zero past rows or cols).

    Raises:
        ValueError: the weight is not a 2-D bfloat16 tensor.
    """
    if weight.dim() != 2 or weight.dtype != torch.bfloat16:
        raise ValueError(f"pack_bf16_amx takes a 2-D bfloat16 weight, got {weight.dtype} {tuple(weight.shape)}")
    rows, cols = weight.shape
    groups, steps, _ = packed_shape(rows, cols)
    padded = F.pad(weight, (0, steps * STEP_COLS - cols, 0, groups * GROUP_ROWS - rows))
    # [g, n, s, j, a, odd] with column 32 s + 4 j + 2 a + odd; the lane's half h = 1 - a.
    view = padded.view(groups, GROUP_ROWS, steps, 8, 2, 2).flip(4)
    return view.permute(0, 2, 3, 5, 1, 4).contiguous().view(groups, steps, GROUP_ROWS * STEP_COLS)


def unpack_bf16_amx(packed: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The inverse of `pack_bf16_amx`: bfloat16 [rows, cols] from packed [groups, k steps, 512]."""
    groups, steps, _ = packed.shape
    view = packed.view(groups, steps, 8, 2, GROUP_ROWS, 2).permute(0, 4, 1, 2, 5, 3).flip(4)
    return view.reshape(groups * GROUP_ROWS, steps * STEP_COLS)[:rows, :cols]


class AmxPackedLinear(nn.Module):
    """A bf16 Linear layer whose weight lives in the packed layout (one slice of a fused matrix; avx512-bf16, amx).

    Args:
        packed: bfloat16 [ceil(out_features / 16), ceil(in_features / 32), 512] (`pack_bf16_amx`).
        bias: [out_features] or None.
        in_features, out_features: the layer's shape.
    """

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, in_features: int,
                 out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("packed", packed)
        self.register_buffer("bias", bias)

    @property
    def weight(self) -> torch.Tensor:
        """bfloat16 [out_features, in_features], unpacked on every access (a copy)."""
        return unpack_bf16_amx(self.packed, self.out_features, self.in_features).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map x [..., in_features] to [..., out_features], as the nn.Linear it replaced."""
        return F.linear(x, self.weight, self.bias)

    # The state dict keeps the nn.Linear's names and dense values ("weight", "bias"): saving a model, or
    # comparing it before and after a runtime packed it, sees no difference.
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        destination[prefix + "weight"] = self.weight
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias if keep_vars else self.bias.detach()

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                              missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        if strict:  # what nn.Module's own loader reports: this layer's keys that are neither weight nor bias
            unexpected_keys += [k for k in state_dict if k.startswith(prefix) and "." not in k[len(prefix):]
                                and k[len(prefix):] not in ("weight", "bias")]
        for name in ("weight", "bias"):
            key = prefix + name
            if key not in state_dict:
                if name == "weight" or self.bias is not None:
                    missing_keys.append(key)
                continue
            value = state_dict[key]
            if name == "weight":
                if tuple(value.shape) != (self.out_features, self.in_features):
                    error_msgs.append(f"size mismatch for {key}: {tuple(value.shape)} in the checkpoint, "
                                      f"{(self.out_features, self.in_features)} in the model")
                    continue
                with torch.no_grad():
                    self.packed.copy_(pack_bf16_amx(value.to(torch.bfloat16)))
            elif self.bias is not None:
                with torch.no_grad():
                    self.bias.copy_(value)


def dense_named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """A model's dense tensors by name, packed layers included.

    Returns `model.named_parameters()` plus each AmxPackedLinear's weight (unpacked: a copy) and bias under
    the names its nn.Linear had ("...q_proj.weight"), for code that reads tensors by name (the hf peer).
    """
    tensors = dict(model.named_parameters())
    for name, module in model.named_modules():
        if isinstance(module, AmxPackedLinear):
            tensors[f"{name}.weight"] = module.weight
            if module.bias is not None:
                tensors[f"{name}.bias"] = module.bias
    return tensors
