"""Checkpoint loading: Hugging Face safetensors names mapped onto the eager model, tensor by tensor.

One name table (`hf_to_solo_name`) covers every supported architecture. Tensors stream from the
safetensors files straight into the model (built on the meta device first), so RAM never holds the
checkpoint twice; an image-text checkpoint's vision tower is skipped unread. Every parameter must arrive
with the expected shape, or loading fails with a message that names the tensor.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

from solo.errors import CheckpointError, WeightsMemoryError
from solo.memory import size_text
from solo.model.config import MULTIMODAL_ARCHITECTURES, ModelConfig
from solo.model.moe import MoeTensorTarget, expert_slice, moe_tensor_target
from solo.model.rope import RotaryEmbedding
from solo.model.transformer import Transformer, out_of_memory

_log = logging.getLogger(__name__)

_LAYER_NAMES = {
    "self_attn.q_proj": "attn.q_proj",
    "self_attn.k_proj": "attn.k_proj",
    "self_attn.v_proj": "attn.v_proj",
    "self_attn.o_proj": "attn.o_proj",
    "self_attn.q_norm": "attn.q_norm",
    "self_attn.k_norm": "attn.k_norm",
    "mlp.gate_proj": "mlp.gate_proj",
    "mlp.up_proj": "mlp.up_proj",
    "mlp.down_proj": "mlp.down_proj",
    "input_layernorm": "attn_norm",
}
# `post_attention_layernorm` is the pre-MLP norm in Llama but the post-attention norm in Gemma 2.
_PLAIN_NORMS = {"post_attention_layernorm": "mlp_norm"}
_SANDWICH_NORMS = {
    "post_attention_layernorm": "attn_out_norm",
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "mlp_out_norm",
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_IGNORED_RE = re.compile(r"rotary_emb\.inv_freq$")


# An image-text checkpoint's language model under the causal LM's names: transformers >= 5 saves it as
# model.language_model.*, the published Gemma 3 files (transformers 4.5x) as language_model.model.*.
_LANGUAGE_MODEL_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                            ("language_model.lm_head.", "lm_head."))
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def language_model_tensor_name(name: str) -> str | None:
    """An image-text checkpoint's tensor name as the causal LM names it, or None for the vision tower's.

    `model.language_model.layers.0.mlp.up_proj.weight` and `language_model.model.layers.0.mlp.up_proj.weight`
    both become `model.layers.0.mlp.up_proj.weight`; `vision_tower.*` and `multi_modal_projector.*` (with or
    without `model.`) are not loaded: Solo runs the language model on text.
    """
    for old, new in _LANGUAGE_MODEL_PREFIXES:
        if name.startswith(old):
            return new + name[len(old):]
    return None if name.startswith(_VISION_PREFIXES) else name


def hf_to_solo_name(name: str, config: ModelConfig) -> str | None:
    """Map a Hugging Face tensor name to the eager model's parameter name.

    Returns None for tensors Solo does not need (RoPE buffers saved by old checkpoints, a stored copy of a
    tied LM head).

    Raises:
        CheckpointError: the name belongs to no supported architecture.
    """
    if _IGNORED_RE.search(name):
        return None
    if name == "model.embed_tokens.weight":
        return "embed.weight"
    if name == "model.norm.weight":
        return "norm.weight"
    if name == "lm_head.weight":
        return None if config.tie_word_embeddings else "lm_head.weight"
    match = _LAYER_RE.match(name)
    if match:
        layer, module, kind = match.groups()
        norms = _SANDWICH_NORMS if config.sandwich_norm else _PLAIN_NORMS
        solo_module = _LAYER_NAMES.get(module) or norms.get(module)
        if solo_module is not None:
            return f"layers.{layer}.{solo_module}.{kind}"
    raise CheckpointError(
        f"checkpoint tensor {name!r} does not belong to a {config.architecture} model; "
        "check that config.json matches the weights"
    )


_FUSED_RE = re.compile(r"^(model\.layers\.\d+\.)(self_attn\.qkv_proj|mlp\.gate_up_proj)\.(weight|bias)$")


def fused_parts(name: str, config: ModelConfig) -> list[tuple[str, int]] | None:
    """The unfused tensors a fused projection (Phi-3's `qkv_proj`, `gate_up_proj`) holds, in row order.

    `self_attn.qkv_proj` [q + 2 * kv, hidden] holds q_proj, k_proj, v_proj; `mlp.gate_up_proj`
    [2 * intermediate, hidden] holds gate_proj then up_proj (transformers' Phi3MLP chunks it so).

    Returns:
        [(Hugging Face name of the part, its rows)], or None when `name` is not a fused projection.
    """
    match = _FUSED_RE.match(name)
    if match is None:
        return None
    prefix, module, kind = match.groups()
    if module == "self_attn.qkv_proj":
        q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        parts = (("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv))
    else:
        parts = (("mlp.gate_proj", config.intermediate_size), ("mlp.up_proj", config.intermediate_size))
    return [(f"{prefix}{part}.{kind}", rows) for part, rows in parts]


def split_fused_tensor(name: str, tensor: torch.Tensor, config: ModelConfig) -> list[tuple[str, torch.Tensor]]:
    """Split a fused projection (see `fused_parts`) into the tensors Solo's model holds; others pass as they are.

    Args:
        name: the checkpoint's tensor name.
        tensor: its value, [rows, ...].
        config: the model's config (head and FFN sizes).

    Returns:
        [(Hugging Face name, tensor)]: the parts are views of `tensor` (no copy), named as unfused
        checkpoints name them.

    Raises:
        CheckpointError: a fused tensor whose first dimension does not match the config's sizes.
    """
    parts = fused_parts(name, config)
    if parts is None:
        return [(name, tensor)]
    sizes = [rows for _, rows in parts]
    if tensor.shape[0] != sum(sizes):
        raise CheckpointError(
            f"checkpoint tensor {name!r} has {tensor.shape[0]} rows; config.json implies {' + '.join(map(str, sizes))}"
            f" = {sum(sizes)}; the config and weights do not match"
        )
    return [(part, value) for (part, _), value in zip(parts, tensor.split(sizes), strict=True)]


def rope_row_order(config: ModelConfig) -> torch.Tensor | None:
    """Where each of a head's q / k rows goes under partial rotary embeddings, or None (RoPE rotates the whole head).

    A checkpoint rotates the first r = `config.rope_dim` dims of each head in pairs (i, i + r / 2) and passes the
    rest through; Solo's model holds the rows reordered so that those pairs sit at (i, i + head_dim / 2), as a
    full rotation's do, and the unrotated dims at r / 2 .. head_dim / 2 - 1 and head_dim / 2 + r / 2 .. head_dim
    - 1, where the RoPE table is the identity (`RotaryEmbedding`). Queries and keys take the same order, so
    q . k, and with it attention, is unchanged.

    Returns:
        int64 [head_dim]: row j of a head in Solo's model is row `order[j]` of the checkpoint's head.
    """
    hd, r = config.head_dim, config.rope_dim
    if r == hd:
        return None
    rest = (hd - r) // 2
    return torch.cat((torch.arange(0, r // 2), torch.arange(r, r + rest),  # first half: rotated, then unrotated
                      torch.arange(r // 2, r), torch.arange(r + rest, hd)))  # second half: their partners


_ROPE_ROWS_RE = re.compile(r"^layers\.\d+\.attn\.(q_proj|k_proj)\.(weight|bias)$")


def reorder_rope_rows(name: str, tensor: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """A loaded q / k projection (Solo's parameter `name`) with each head's rows in `rope_row_order`.

    Any other parameter is returned as it is.

    Args:
        name: Solo's parameter name ("layers.3.attn.q_proj.weight").
        tensor: its value, [heads * head_dim, ...] for the q / k projections.
        config: the model's config.
    """
    return _rope_rows(name, tensor, config, inverse=False)


def restore_rope_rows(name: str, tensor: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """The inverse of `reorder_rope_rows`: each head's rows of Solo's q / k projection `name` in the checkpoint's order.

    For writing the model out to another engine (the bench's peers). Any other parameter is returned as it is.
    """
    return _rope_rows(name, tensor, config, inverse=True)


def _rope_rows(name: str, tensor: torch.Tensor, config: ModelConfig, inverse: bool) -> torch.Tensor:
    order = rope_row_order(config)
    if order is None or not _ROPE_ROWS_RE.match(name):
        return tensor
    if inverse:
        order = order.argsort()
    heads = tensor.shape[0] // config.head_dim
    rows = tensor.reshape(heads, config.head_dim, *tensor.shape[1:])
    return rows.index_select(1, order.to(tensor.device)).reshape(tensor.shape)


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a model folder, single-file or sharded (model.safetensors first, as transformers).

    Raises:
        CheckpointError: no safetensors weights, a shard listed in the index is missing, or only
            PyTorch `.bin` weights exist.
    """
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if single.is_file():  # before an index, as transformers looks (save_pretrained over a sharded folder keeps it)
        return [single]
    if index.is_file():
        shards = index_shards(index)
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise CheckpointError(
                f"missing shard {missing[0]}"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                + f" listed in {index.name} in {folder}; the download is incomplete, fetch the missing files"
            )
        return [folder / s for s in shards]
    if any(folder.glob("*.bin")) or any(folder.glob("*.pth")):
        raise CheckpointError(
            f"{folder} holds PyTorch .bin/.pth weights only; Solo loads safetensors: convert them with "
            "transformers (model.save_pretrained(folder, safe_serialization=True))"
        )
    raise CheckpointError(
        f"{folder} has no model.safetensors or model.safetensors.index.json; the folder is partial, "
        "download the weights too"
    )


_SAFETENSORS_FLOATS = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


@contextmanager
def _safetensors_path(path: Path) -> Iterator[str]:
    """A path safetensors can open for `path` (safetensors opens UTF-8 paths only).

    The path itself, or, where it is not valid UTF-8, the file opened here and named by its descriptor
    (/proc/self/fd/N, Linux).

    Raises:
        CheckpointError: a path that is not UTF-8 on a system without /proc/self/fd.
        OSError: the file cannot be opened.
    """
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        if not os.path.isdir("/proc/self/fd"):
            raise CheckpointError(f"the path {text!r} is not valid UTF-8, which safetensors cannot open; rename "
                                  "the folder, or link to it from a UTF-8 path") from None
        fd = os.open(path, os.O_RDONLY)
        try:
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    yield text


def checkpoint_dtype(folder: Path) -> str | None:
    """The dtype of the first 16- or 32-bit floating-point tensor of the folder's first safetensors file.

    Read from the file's header (no tensor is read): "float32", "bfloat16", "float16", or None where there is none
    or no readable file. What transformers' `dtype="auto"` takes when config.json names no dtype
    (`get_state_dict_dtype`).
    """
    try:
        path = checkpoint_files(folder)[0]
        with _safetensors_path(path) as opened, safe_open(opened, framework="pt") as f:
            for name in f.keys():
                found = _SAFETENSORS_FLOATS.get(f.get_slice(name).get_dtype())
                if found is not None:
                    return found
    except (CheckpointError, OSError, RuntimeError, ValueError, SafetensorError):
        return None  # (the load that follows names what is wrong with the folder)
    return None


def index_shards(index: Path) -> list[str]:
    """The shard file names a `model.safetensors.index.json` lists (its weight_map's values), sorted, unique.

    Raises:
        CheckpointError: the file is unreadable, not JSON, or has no weight_map object of file names.
    """
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, RecursionError) as exc:
        raise CheckpointError(f"{index} is not a valid safetensors index ({exc!r}); re-download it") from None
    if not isinstance(weight_map, dict) or not all(isinstance(s, str) and s for s in weight_map.values()):
        raise CheckpointError(
            f"{index} is not a valid safetensors index (its weight_map is not an object of tensor names to "
            "file names); re-download it")
    return sorted(set(weight_map.values()))


def _iter_tensors(files: list[Path], device: str,
                  skip: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    # skip: names of tensors not to read at all (an image-text checkpoint's vision tower).
    bar = tqdm(total=len(files), desc="Loading shards", unit="shard", disable=len(files) < 2)
    for path in files:
        try:
            with _safetensors_path(path) as opened, safe_open(opened, framework="pt", device=device) as f:
                for name in f.keys():
                    if skip is None or not skip(name):
                        yield name, f.get_tensor(name)
        except (OSError, RuntimeError, ValueError, SafetensorError, MemoryError) as exc:
            if out_of_memory(exc):  # (mmap's ENOMEM under `ulimit -v`: not a damaged file)
                raise WeightsMemoryError(_weights_memory_message(files, exc)) from None
            raise CheckpointError(
                f"cannot read {path} ({exc}); the file is damaged or incomplete, re-download it"
            ) from None
        bar.update(1)
    bar.close()


def load_weights(
    folder: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> Transformer:
    """Build the eager model and fill it from the folder's safetensors files.

    Args:
        folder: model folder with config.json and safetensors weights.
        config: the parsed config.json.
        dtype: dtype of the loaded weights (float32, bfloat16 or float16).
        device: where the weights live.

    Returns:
        The model in eval mode with every parameter loaded.

    Raises:
        CheckpointError: a missing shard or tensor, a tensor with the wrong shape, an unknown tensor.
        WeightsMemoryError: the weights do not fit in the memory this process may use.

    A lane model (`config.lanes` set) is a `solo.model.lanes.LaneTransformer` (see `load_lane_weights`).
    """
    try:
        if config.lanes is not None:
            return load_lane_weights(folder, config, dtype, device)
        return _load_dense_weights(folder, config, dtype, device)
    except (MemoryError, RuntimeError, OSError) as exc:
        if not out_of_memory(exc):
            raise
        raise WeightsMemoryError(_weights_memory_message(checkpoint_files(folder), exc)) from None


def _weights_memory_message(files: list[Path], exc: BaseException) -> str:
    try:
        on_disk = f" ({size_text(sum(f.stat().st_size for f in files))} of weights on disk)"
    except OSError:
        on_disk = ""
    detail = str(exc) or type(exc).__name__
    return (f"out of memory loading the model{on_disk}: {detail}; free memory, raise this process's memory limit "
            "(ulimit -v, the container's limit) or run a smaller model")


def _load_dense_weights(folder: Path, config: ModelConfig, dtype: torch.dtype,
                        device: torch.device | str) -> Transformer:
    with torch.device("meta"):
        model = Transformer(config)
    expected = {name: p.shape for name, p in model.named_parameters()}
    loaded: set[str] = set()
    expert_slices: dict[str, set[tuple[int, str]]] = {}
    device_str = str(device)
    read_device = device_str if device_str.startswith("cuda") else "cpu"
    source: dict[str, str] = {}  # parameter -> the checkpoint tensor that filled it
    held_head: torch.Tensor | None = None  # an LM head the config says is tied to the embedding
    multimodal = config.architecture in MULTIMODAL_ARCHITECTURES
    skip = (lambda name: language_model_tensor_name(name) is None) if multimodal else None
    for file_name, file_tensor in _iter_tensors(checkpoint_files(folder), read_device, skip):
        lm_name = language_model_tensor_name(file_name) if multimodal else file_name
        for hf_name, tensor in split_fused_tensor(lm_name, file_tensor, config):
            # Errors name the tensor the file holds (a fused one, with the part meant).
            shown = repr(file_name) if hf_name == lm_name else f"{file_name!r} (its {hf_name.split('.')[-2]} rows)"
            target = moe_tensor_target(hf_name, config) if config.is_moe else None
            if target is not None and target.expert is not None:
                _check_floating(tensor, shown)
                _load_expert_slice(model, hf_name, target, tensor, expected, expert_slices, dtype, device)
                if len(expert_slices[target.name]) == _expert_slice_count(config, target):
                    loaded.add(target.name)
                continue
            name = target.name if target is not None else hf_to_solo_name(hf_name, config)
            if name is None:
                if hf_name == "lm_head.weight" and config.tie_word_embeddings:
                    _check_floating(tensor, shown)
                    held_head = tensor.to(device=device, dtype=dtype)  # compared with the embedding once loaded
                continue
            if name not in expected:
                raise CheckpointError(
                    f"checkpoint tensor {shown} has no place in this {config.architecture} config "
                    f"(maps to {name}); check that config.json matches the weights"
                )
            _check_floating(tensor, shown)
            if name in source:
                raise CheckpointError(
                    f"checkpoint tensors {source[name]!r} and {file_name!r} both hold {name}: the weights repeat it "
                    "(fused and unfused copies of a projection, or two copies of a language model?); keep one of them"
                )
            if tuple(tensor.shape) != tuple(expected[name]):
                raise CheckpointError(
                    f"checkpoint tensor {shown} has shape {tuple(tensor.shape)}, config.json implies "
                    f"{tuple(expected[name])}; the config and weights do not match"
                )
            value = tensor.to(device=device, dtype=dtype)
            reordered = reorder_rope_rows(name, value, config)
            if (reordered is value and config.rotary_dim is not None and "qkv_proj" in lm_name
                    and value.untyped_storage().data_ptr() == file_tensor.untyped_storage().data_ptr()):
                # v_proj as a view of a fused qkv_proj whose q / k parts were copied to reorder them: kept alone it
                # would keep the whole fused tensor alive (0.8 GB of Phi-4-mini in bf16).
                reordered = value.clone()
            _set_parameter(model, name, reordered)
            del tensor
            loaded.add(name)
            source[name] = file_name
        del file_tensor
    _check_complete(expected, loaded, config, hf_names=not multimodal)  # (an image-text file's names differ)
    if held_head is not None and held_head.shape != model.embed.weight.shape:
        raise CheckpointError(f"checkpoint tensor lm_head.weight has shape {tuple(held_head.shape)}, the embedding "
                              f"{tuple(model.embed.weight.shape)}; the config and weights do not match")
    if held_head is not None and not torch.equal(held_head, model.embed.weight):
        # As transformers (5.x) loads it: a stored head that differs from the embedding is not tied.
        _log.warning("config.json ties the LM head to the embedding but the checkpoint holds a different "
                     "lm_head.weight; using it, untied (as transformers does; set tie_word_embeddings to false to "
                     "silence this)")
        model.config = dataclasses.replace(config, tie_word_embeddings=False)
        model.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False, device="meta")
        model.lm_head.weight = torch.nn.Parameter(held_head, requires_grad=False)
    # Buffers built on the meta device hold no values; rebuild the RoPE table for real.
    model.rotary = RotaryEmbedding(config).to(device)
    return model.eval().requires_grad_(False)


def _check_floating(tensor: torch.Tensor, shown: str) -> None:
    # Integer weights without a quantization_config (packed or scaled values) would be cast to floats and
    # run as garbage.
    if not tensor.is_floating_point() or tensor.element_size() == 1:  # integers, or FP8 without its scales
        raise CheckpointError(
            f"checkpoint tensor {shown} holds {str(tensor.dtype).removeprefix('torch.')} values, not 16- or 32-bit "
            "floating-point weights: a quantized checkpoint whose config.json has no quantization_config? Solo loads "
            "float32 / float16 / bfloat16 checkpoints (and quantizes them itself with --quantize int8|int4)"
        )


def _check_complete(expected: dict[str, object], loaded: set[str], config: ModelConfig | None = None,
                    hf_names: bool = False) -> None:
    """Raise CheckpointError naming the first parameter in `expected` that no checkpoint tensor filled.

    With `hf_names` (a causal LM's checkpoint) it is named as the checkpoint names it
    (`model.layers.2.self_attn.k_proj.weight`) where `hf_to_solo_name` maps such a name to it, with Solo's own
    name beside it.
    """
    missing = sorted(set(expected) - loaded)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        fused = _fused_home(missing[0], config)
        where = f", which {config.architecture} checkpoints hold in {fused}" if fused and config else ""
        hf_name = _hf_name(missing[0], config) if hf_names and config is not None and not fused else None
        shown = f"{hf_name} (Solo's {missing[0]})" if hf_name else missing[0]
        raise CheckpointError(
            f"checkpoint lacks tensor {shown}{more}{where}; the weights are incomplete or belong to another model"
        )


def _hf_name(solo_name: str, config: ModelConfig) -> str | None:
    # The Hugging Face name that `hf_to_solo_name` maps to `solo_name`, or None.
    match = re.match(r"^layers\.(\d+)\.(.+)\.(weight|bias)$", solo_name)
    modules = [*_LAYER_NAMES, *(_SANDWICH_NORMS if config.sandwich_norm else _PLAIN_NORMS)] if match else []
    candidates = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                  *(f"model.layers.{match[1]}.{m}.{match[3]}" for m in modules)]
    for name in candidates:
        try:
            if hf_to_solo_name(name, config) == solo_name:
                return name
        except CheckpointError:
            continue
    return None


def _fused_home(solo_name: str, config: ModelConfig | None) -> str | None:
    # The fused checkpoint tensor (Phi-3) one of whose parts is the missing Solo parameter, or None.
    layer = re.match(r"^layers\.(\d+)\..+\.(weight|bias)$", solo_name)
    if config is None or config.architecture != "Phi3ForCausalLM" or layer is None:
        return None
    for module in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
        fused = f"model.layers.{layer[1]}.{module}.{layer[2]}"
        if any(hf_to_solo_name(part, config) == solo_name for part, _ in fused_parts(fused, config) or ()):
            return fused
    return None


def _set_parameter(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    module._parameters[attr] = torch.nn.Parameter(tensor, requires_grad=False)


def _expert_slice_count(config: ModelConfig, target: MoeTensorTarget) -> int:
    # gate_up_proj is filled by a gate and an up tensor per expert, down_proj by one tensor per expert.
    return config.num_experts * (1 if target.part == "down" else 2)


def _load_expert_slice(
    model: Transformer, hf_name: str, target: MoeTensorTarget, tensor: torch.Tensor,
    expected: dict[str, torch.Size], slices: dict[str, set[tuple[int, str]]], dtype: torch.dtype,
    device: torch.device | str,
) -> None:
    # A per-expert checkpoint tensor fills one slice of a fused [experts, ...] parameter, allocated on the
    # first slice that arrives.
    if target.name not in expected or target.expert >= expected[target.name][0]:
        raise CheckpointError(
            f"checkpoint tensor {hf_name!r} has no place in this {model.config.architecture} config (expert "
            f"{target.expert} of {model.config.num_experts}); check that config.json matches the weights"
        )
    if target.name not in slices:
        _set_parameter(model, target.name, torch.empty(expected[target.name], dtype=dtype, device=device))
        slices[target.name] = set()
    view = expert_slice(model.get_parameter(target.name), target)
    if tuple(tensor.shape) != tuple(view.shape):
        raise CheckpointError(
            f"checkpoint tensor {hf_name!r} has shape {tuple(tensor.shape)}, config.json implies "
            f"{tuple(view.shape)}; the config and weights do not match"
        )
    view.copy_(tensor)
    slices[target.name].add((target.expert, target.part))
# ------------------------------------------------------------------------------------- Laneformer layout

_LANE_ROW = ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3")
_LANE_COLUMN = ("attention.wo", "feed_forward.w2")
_LANE_NORMS = ("attention_norm", "ffn_norm")
_LANE_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")


def laneformer_to_solo_name(name: str, config: ModelConfig) -> str | None:
    """Map a Laneformer checkpoint tensor name to the `LaneTransformer` parameter name.

    The names are TorchTitan style (../shared/laneformer.md section 2); the parameter is the same name without
    `model.`. Returns None for tensors Solo does not need.

    Raises:
        CheckpointError: a name that belongs to no Laneformer tensor.
    """
    if _IGNORED_RE.search(name):
        return None
    if name in ("model.tok_embeddings.weight", "model.norm.weight"):
        return name.removeprefix("model.")
    if name == "lm_head.weight":
        return None if config.tie_word_embeddings else name
    match = _LANE_LAYER_RE.match(name)
    if match and match.group(2) in _LANE_ROW + _LANE_COLUMN + _LANE_NORMS:
        return name.removeprefix("model.")
    raise CheckpointError(
        f"checkpoint tensor {name!r} is not a Laneformer tensor (expected model.tok_embeddings, "
        "model.layers.N.attention.{wq,wk,wv,wo}, model.layers.N.feed_forward.{w1,w2,w3}, attention_norm, "
        "ffn_norm, model.norm, lm_head); check that config.json matches the weights"
    )


def lane_tensor(name: str, tensor: torch.Tensor, config: ModelConfig, shard: object) -> torch.Tensor:
    """Put a Laneformer tensor into the `LaneTransformer` layout and keep the lanes / vocabulary rows of `shard`.

    Lane linears are stored either in the spec's lane layout (row: `[L, out/L, in]`, column:
    `[L, out, in/L]`) or as the equivalent dense `[out, in]` matrix (lane-major outputs / inputs).

    Args:
        name: the `LaneTransformer` parameter name.
        tensor: the checkpoint tensor.
        config: the lane model's config.
        shard: a `solo.model.lanes.LaneShard`.

    Raises:
        CheckpointError: a shape that fits neither layout.
    """
    lanes = config.lanes.num_lanes
    module = name.rsplit(".", 1)[0].split(".", 2)[-1] if name.startswith("layers.") else ""
    a, b = shard.lane_start, shard.lane_stop
    if module in _LANE_ROW or module in _LANE_COLUMN:
        row = module in _LANE_ROW
        if tensor.ndim == 2:
            out, inp = tensor.shape
            if (out if row else inp) % lanes:
                raise CheckpointError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, whose "
                    f"{'rows' if row else 'columns'} do not split into num_lanes = {lanes} lanes"
                )
            if row:
                tensor = tensor.view(lanes, out // lanes, inp)
            else:
                tensor = tensor.view(out, lanes, inp // lanes).transpose(0, 1)
        return tensor[a:b]
    if name == "lm_head.weight":
        head = config.lanes.lm_head_type
        if head == "lane":
            d = config.hidden_size
            if tensor.ndim == 2 and tensor.shape[1] == lanes * d:
                return tensor[:, a * d:b * d]
            return tensor
        if head == "vocab_parallel":
            per_lane = config.vocab_size // lanes
            return tensor[a * per_lane:b * per_lane]
        return tensor[shard.vocab_start:shard.vocab_stop]
    return tensor


def load_lane_weights(
    folder: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device | str = "cpu", shard: object = None,
    comm: object = None,
) -> torch.nn.Module:
    """Build a `LaneTransformer` and fill it from a Laneformer-layout checkpoint.

    Args:
        folder: model folder.
        config: its config (with `lanes`).
        dtype: weight dtype.
        device: where the weights live.
        shard: the `LaneShard` to keep (default: every lane, one process).
        comm: cross-lane communication for tensor parallelism (default: one process).

    Returns:
        The model in eval mode, without gradients.

    Raises:
        CheckpointError: a missing, unknown or misshapen tensor (the message names it).
    """
    from solo.model.lanes import LaneRotary, LaneShard, LaneTransformer

    shard = shard or LaneShard.whole(config)
    with torch.device("meta"):
        model = LaneTransformer(config, shard, comm)
    expected = {name: p.shape for name, p in model.named_parameters()}
    loaded: set[str] = set()
    device_str = str(device)
    read_device = device_str if device_str.startswith("cuda") else "cpu"
    for ckpt_name, tensor in _iter_tensors(checkpoint_files(folder), read_device):
        name = laneformer_to_solo_name(ckpt_name, config)
        if name is None:
            continue
        if name not in expected:
            raise CheckpointError(
                f"checkpoint tensor {ckpt_name!r} has no place in this Laneformer config; check that config.json "
                "matches the weights"
            )
        _check_floating(tensor, repr(ckpt_name))
        local = lane_tensor(name, tensor, config, shard)
        if tuple(local.shape) != tuple(expected[name]):
            raise CheckpointError(
                f"checkpoint tensor {ckpt_name!r} has shape {tuple(tensor.shape)}, which does not fit this "
                f"config.json (expected {tuple(expected[name])} for the lanes held); the config and weights do "
                "not match"
            )
        _set_parameter(model, name, local.to(device=device, dtype=dtype).contiguous())
        loaded.add(name)
    _check_complete(expected, loaded)
    model.rotary = LaneRotary(config).to(device)
    return model.eval().requires_grad_(False)
