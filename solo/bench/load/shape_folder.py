"""A model folder of a bench shape with random weights, for `solo bench --load --shape` (the server loads folders).

The load test sends text, so the folder needs a tokenizer whose every id the model may emit: the bundled
model's (or `--tokenizer`'s), with the shape's vocabulary cut to that tokenizer's size. Everything else (layers,
widths, heads, context) is the shape's, so a step reads the shape's bytes except the embedding and LM head:
for Qwen2.5-0.5B, 730 MB of bf16 weights instead of 988 MB.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from solo.errors import SoloError

# What is copied from the tokenizer's folder besides the weights and config.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                    "chat_template.jinja")


def write_shape_folder(shape: str, folder: Path, tokenizer_folder: Path, dtype: str = "auto",
                       seed: int = 0) -> dict[str, object]:
    """Write `shape`'s random-weight model (safetensors, config.json) and a tokenizer into `folder`.

    Args:
        shape: a `solo bench --shape` name (dense or MoE; not a lane shape, which transformers cannot save).
        folder: an existing, empty folder.
        tokenizer_folder: a model folder whose tokenizer (and generation config, chat template) is copied; its
            token ids set the vocabulary, and its config.json the BOS / EOS / pad ids.
        dtype: weight dtype name (`solo.model.hub.resolve_dtype`); auto takes the shape's.
        seed: random seed of the weights (`solo.bench.shapes.build_model`).

    Returns:
        The config.json fields written (the shape's, with vocab_size and the special token ids replaced).

    Raises:
        SoloError: an unknown or lane shape, or a tokenizer folder without config.json / tokenizer.json.
    """
    from solo.bench.peers import PeerSkipped
    from solo.bench.peers.hf import hf_model_from_solo
    from solo.bench.shapes import build_model, shape_raw_config
    from solo.model.config import ModelConfig
    from solo.model.hub import resolve_dtype
    from solo.tokenizer import Tokenizer

    raw = shape_raw_config(shape)
    if ModelConfig.from_dict(dict(raw)).lanes is not None:
        raise SoloError(f"--load --shape {shape}: a lane shape cannot be written as a transformers checkpoint; "
                        "serve a lane model's folder instead")
    if not (tokenizer_folder / "config.json").is_file() or not (tokenizer_folder / "tokenizer.json").is_file():
        raise SoloError(f"{tokenizer_folder} needs config.json and tokenizer.json to lend its tokenizer to a shape")
    tokenizer = Tokenizer.from_folder(tokenizer_folder)
    base = json.loads((tokenizer_folder / "config.json").read_text(encoding="utf-8"))
    raw["vocab_size"] = tokenizer.vocab_size
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in base:
            raw[key] = base[key]
    config = ModelConfig.from_dict(dict(raw))
    torch_dtype = resolve_dtype(dtype, config.torch_dtype)
    model = build_model(config, torch_dtype, seed=seed)
    try:
        hf_model = hf_model_from_solo(model, raw, torch_dtype, torch.device("cpu"))
    except PeerSkipped as exc:
        raise SoloError(f"--load --shape {shape}: cannot write it as a transformers checkpoint ({exc})") from None
    hf_model.save_pretrained(folder)
    for name in _TOKENIZER_FILES:
        if (tokenizer_folder / name).is_file():
            shutil.copy(tokenizer_folder / name, folder / name)
    return raw
