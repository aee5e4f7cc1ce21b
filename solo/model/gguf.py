"""GGUF files (llama.cpp's format) as Solo model folders.

A `.gguf` file is converted once into a Hugging Face style folder in Solo's cache (config.json, tokenizer.json,
tokenizer_config.json with the chat template, model.safetensors) and loaded from there like any other folder.
Reading, dequantizing and un-permuting the tensors (llama.cpp interleaves the rotary halves of q/k rows) is done
by `transformers`' GGUF integration on top of the `gguf` package; the tokenizer and chat template come from the
file's metadata the same way.

Weight types: F32, F16 and BF16 are kept exactly (float32 / float16 / bfloat16 safetensors). Quantized types that
the `gguf` package can dequantize (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, ...) are dequantized to bfloat16, so their
quantization error stays (plus bfloat16 rounding); `--quantize int8|int4` re-quantizes for Solo's CPU kernels.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from solo.env import solo_cache_home
from solo.errors import CheckpointError, SoloWarning, UnsupportedArchitectureError, shown_path, undeletable

# GGUF general.file_type / tensor types kept bit-exact, and the dtype Solo stores them in.
_EXACT = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def cache_root() -> Path:
    """Solo's cache of converted files: $SOLO_CACHE_DIR, else $XDG_CACHE_HOME/solo (~/.cache/solo)."""
    explicit = os.environ.get("SOLO_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return solo_cache_home()


# `_folder_name`'s (a file name may hold a newline); not a `.converting-*` folder
_CONVERTED_NAME = re.compile(r"^[^.].*-[0-9a-f]{16}$", re.DOTALL)


def prune_conversions(same_file: Path | None = None, under: Sequence[Path] = (), keep: Path | None = None,
                      strict: bool = False) -> int:
    """Delete converted folders Solo knows are stale; returns the bytes freed.

    Only folders named as `gguf_to_folder` names them are considered (never one being written), and only
    these: the conversions of `same_file` (the absolute path of a file about to be converted again because
    it changed since), and those of files that lay under `under` and are gone (the snapshots `solo rm`
    deleted). A source that merely cannot be seen now (an unmounted drive) is left alone.

    Args:
        same_file: an absolute GGUF path whose earlier conversions are stale.
        under: folders whose deleted GGUF files' conversions are stale.
        keep: the current version's folder, never deleted (another process may have just made it).
        strict: raise when a folder cannot be deleted (`solo rm`); otherwise it is left for a later prune.

    Raises:
        OSError: with `strict`, a folder could not be deleted (a read-only cache).
    """
    root = cache_root() / "gguf"
    freed = 0
    for source in root.glob("*/gguf_source.json"):
        folder = source.parent
        if not _CONVERTED_NAME.match(folder.name) or folder == keep:
            continue
        try:
            file = Path(json.loads(source.read_text(encoding="utf-8"))["file"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable: not ours to judge
        stale = (same_file is not None and file == same_file) or (
            any(file.is_relative_to(u) for u in under) and not os.path.lexists(file))
        if not stale:
            continue
        size = _folder_size(folder)
        shutil.rmtree(folder, ignore_errors=not strict)
        freed += size
    return freed


@dataclass(frozen=True)
class Conversion:
    """One GGUF file converted into Solo's cache (see `gguf_to_folder`).

    Attributes:
        folder: the converted model folder.
        source: the GGUF file it was converted from (absolute, as it was named).
        size_bytes: the folder's size on disk (quantized types are stored dequantized, so it may be several times
            the source's).
        source_exists: whether the source file is still there (a gone source's conversion is never used again).
    """

    folder: Path
    source: Path
    size_bytes: int
    source_exists: bool


def list_conversions() -> list[Conversion]:
    """The converted folders in Solo's cache, largest first (`solo list` shows them; `solo rm FILE` deletes them)."""
    found = []
    for record in (cache_root() / "gguf").glob("*/gguf_source.json"):
        folder = record.parent
        if not _CONVERTED_NAME.match(folder.name):
            continue
        try:
            source = Path(json.loads(record.read_text(encoding="utf-8"))["file"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable, or deleted meanwhile
        found.append(Conversion(folder, source, _folder_size(folder), os.path.lexists(source)))
    return sorted(found, key=lambda c: (-c.size_bytes, str(c.source)))


def remove_conversions(source: str | Path) -> int:
    """Delete the converted folders of one GGUF file (which may be gone); returns the bytes freed.

    Args:
        source: the GGUF file's path as it was given to Solo (relative paths are taken from the current folder).

    Raises:
        ModelNotFoundError: Solo's cache holds no conversion of that file.
        SoloError: a converted folder could not be deleted (a read-only cache, or another user's).
    """
    from solo.errors import ModelNotFoundError

    file = Path(source).expanduser().resolve()  # as named then, or through other links and ".." parts
    recorded = {c.source for c in list_conversions() if c.source == file or c.source.resolve() == file}
    if not recorded:
        raise ModelNotFoundError(f"Solo's cache holds no conversion of {file}; `solo list` shows the converted files")
    try:
        return sum(prune_conversions(same_file=named, strict=True) for named in recorded)
    except OSError as exc:
        raise undeletable(f"Solo's conversion of {file}", exc, "SOLO_CACHE_DIR") from None


def _folder_size(folder: Path) -> int:
    # Bytes of the files under a converted folder (0 when it was deleted meanwhile).
    try:
        return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    except OSError:
        return 0


# What a conversion writes, recorded in gguf_source.json; a folder of an older format is brought up to date
# in place (2: the end-of-turn tokens and the file's sampling defaults in generation_config.json; 3: a
# SentencePiece tokenizer's space prefix on every text, `_spm_space_prefix`; 4: Phi-3's special tokens taking the
# blanks after them, `_phi3_special_tokens`; 5: the RoPE scaling of llama, mistral, qwen2, qwen3 and gemma2 files,
# `_rope_scaling_fields`).
_CONVERSION_FORMAT = 5


def _folder_name(named: Path, src: Path) -> str:
    # The converted folder's name: the file's name and a key of its resolved path, size and mtime.
    # A path's bytes that are not UTF-8 stay as they are in the key (the key of any other path is unchanged), and
    # become U+FFFD in the name: safetensors opens UTF-8 paths only.
    stat = src.stat()
    key = hashlib.sha256(f"{src}\0{stat.st_size}\0{stat.st_mtime_ns}".encode("utf-8", "surrogateescape")).hexdigest()
    stem = named.stem.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return f"{stem}-{key[:16]}"


def is_gguf(path: str | Path) -> bool:
    """Whether `path` names a GGUF file (by its magic bytes, or by its suffix when it cannot be read)."""
    p = Path(path).expanduser()
    if not p.is_file():
        return False
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return p.suffix.lower() == ".gguf"


def _weight_types(reader: Any) -> dict[str, int]:  # noqa: ANN401
    counts: dict[str, int] = {}
    for tensor in reader.tensors:
        name = tensor.tensor_type.name
        counts[name] = counts.get(name, 0) + 1
    return counts


def stored_dequantized(folder: str | Path) -> tuple[str, list[str], str] | None:
    """What Solo's conversion of a GGUF file of quantized weights stores them as.

    Returns:
        (the file's name, its quantized tensor types, the dtype the conversion stores them in); None for any other
        folder, and for a conversion of F32 / F16 / BF16 weights or one stored in float32.
    """
    try:
        source = json.loads((Path(folder) / "gguf_source.json").read_text(encoding="utf-8"))
        quantized = sorted(t for t in source["tensor_types"] if t not in _EXACT)
        name, stored = Path(source["file"]).name, str(source["stored_dtype"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (name, quantized, stored) if quantized and stored != "float32" else None


def is_split_part(path: str | Path) -> bool:
    """True for one part of a split GGUF file (llama-gguf-split's "name-00001-of-00003.gguf")."""
    stem = Path(path).stem
    return "-of-" in stem and stem.rsplit("-of-", 1)[-1].isdigit()


def is_projector(path: str | Path) -> bool:
    """True for a multimodal projector file ("mmproj-model-f16.gguf"): an image encoder, not a language model.

    Repositories of GGUF files ship it beside the model's files; llama.cpp's -hf and Ollama leave it out when they
    pick the model's file, and so does Solo.
    """
    return "mmproj" in Path(path).name.lower()


def gguf_to_folder(path: str | Path, log: Any = None) -> Path:  # noqa: ANN401
    """Convert a GGUF file to a model folder in Solo's cache (once; later calls reuse it).

    Args:
        path: the .gguf file.
        log: called with one line of progress text (None: stderr).

    Returns:
        The folder (config.json, tokenizer files, model.safetensors, gguf_source.json).

    Raises:
        CheckpointError: the file is damaged, split into parts, or holds a tensor type that cannot be
            dequantized; the cache folder has no room for the converted weights or cannot be written.
        UnsupportedArchitectureError: the file's architecture is not one Solo runs.
    """
    import sys

    named = Path(path).expanduser()  # its name, not a link's target (a Hub snapshot links to blobs named by hash)
    src = named.resolve()
    stat = src.stat()
    folder = cache_root() / "gguf" / _folder_name(named, src)
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    _prune_abandoned_conversions(folder.parent)  # (before the free-space check below: they may hold the room it needs)
    if _whole_conversion(folder):
        changes = _bring_up_to_date(folder, src)
        if changes:
            say(f"updated Solo's conversion of {named.name} to what a conversion writes now ({'; '.join(changes)}), as "
                "llama.cpp reads them")
        return folder
    if folder.exists():  # a file of it deleted or lost: converted again, not run half
        say(f"Solo's conversion of {named.name} in {folder} lacks some of its files; converting it again")
        try:
            shutil.rmtree(folder)
        except OSError as exc:
            raise undeletable(f"the damaged conversion {folder}", exc, "SOLO_CACHE_DIR") from None
    if is_split_part(named):
        raise CheckpointError(f"{named.name} is one part of a split GGUF; merge the parts first "
                              "(llama-gguf-split --merge) and pass the merged file")
    say(f"converting {shown_path(named.name)} to a model folder in {shown_path(folder.parent)} (once) ...")
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(src))
    except (ValueError, OSError, IndexError) as exc:
        raise CheckpointError(f"{src} is not a readable GGUF file ({exc}); re-download it") from None
    arch = _field(reader, "general.architecture")
    if "tokenizer.ggml.tokens" not in reader.fields:  # before the slow part: transformers' reader needs them
        raise CheckpointError(f"{named.name} carries no tokenizer (no tokenizer.ggml.tokens field): Solo takes the "
                              "tokenizer and chat template from the GGUF file; use a file written with them "
                              "(llama.cpp's convert_hf_to_gguf.py writes them)")
    _check_special_token_ids(reader, named.name)
    types = _weight_types(reader)
    matrices = sorted(t for t in types if t not in ("F32",)) or ["F32"]
    dtype = _EXACT.get(matrices[0], "bfloat16") if len(matrices) == 1 else "bfloat16"
    parent = _mkdir(folder.parent)
    prune_conversions(same_file=named.absolute(), keep=folder)  # this file's earlier versions: it changed since
    need = sum(int(t.n_elements) for t in reader.tensors) * (4 if dtype == "float32" else 2)
    quantized = [t for t in matrices if t not in _EXACT]
    if quantized:  # (a Q4_K_M 8B needs about 16 GB, not its file's 5: said before anyone wonders)
        from solo.memory import size_text

        say(f"{named.name} holds {', '.join(quantized)} weights, which Solo runs dequantized to bfloat16 (about "
            f"{size_text(need)}) unless --quantize int8 or int4 quantizes them again for the CPU kernels")
    free = shutil.disk_usage(parent).free
    if need > free:  # quantized files grow (Q4_0 about 3.5x): say so before writing most of it
        from solo.model.store import human_size

        raise CheckpointError(f"converting {named.name} writes about {human_size(need)} of {dtype} weights to "
                              f"{parent}, which has {human_size(free)} free; free space or point SOLO_CACHE_DIR at "
                              "a folder with room")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".converting-{os.getpid()}@{socket.gethostname()}@", dir=parent))
    except OSError as exc:
        raise CheckpointError(_cache_write_error(parent, exc)) from None
    alive = None
    try:
        alive = _hold_alive_lock(tmp)
        _convert(reader, src, tmp, arch, dtype)
        (tmp / "gguf_source.json").write_text(json.dumps(
            {"file": str(named.absolute()), "size_bytes": stat.st_size, "architecture": arch, "tensor_types": types,
             "stored_dtype": dtype, "format": _CONVERSION_FORMAT,
             "files": sorted(p.name for p in tmp.iterdir() if p.name != _ALIVE_LOCK)}, indent=2) + "\n")
        try:
            tmp.rename(folder)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
            if not (folder / "gguf_source.json").is_file():
                raise CheckpointError(f"could not move the converted {named.name} into {folder}; run again") from None
        else:
            (folder / _ALIVE_LOCK).unlink(missing_ok=True)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_write_failure(exc):
            raise CheckpointError(_cache_write_error(parent, exc)) from None
        raise
    finally:
        if alive is not None:
            alive.close()
    return folder


# A lock file inside a conversion's temporary folder, held while the conversion runs: the kernel releases it when
# the process ends, however it ends and in whatever PID namespace (a container's entrypoint restarted as PID 1 saw
# its own killed run's PID 1 "alive"; a container on the host's network shares the host name, not the PIDs).
_ALIVE_LOCK = ".alive.lock"
# A folder without a lock file this young may be a conversion that has not yet taken it.
_LOCK_GRACE_S = 60.0


def _hold_alive_lock(folder: Path) -> Any:  # noqa: ANN401
    # The open, locked file (None where flock is missing: not POSIX); closing it releases the lock.
    try:
        import fcntl
    except ImportError:
        return None
    # Locked under another name, then renamed: a prune never finds the lock file there and free.
    fresh = folder / (_ALIVE_LOCK + ".new")
    handle = open(fresh, "w")  # noqa: SIM115 (held until the conversion ends)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # (a file system without locks: no lock file, so the PID and age rules judge it)
        handle.close()
        fresh.unlink(missing_ok=True)
        return None
    fresh.rename(folder / _ALIVE_LOCK)
    return handle


def _lock_says_abandoned(folder: Path) -> bool | None:
    # True: its lock file is free (the converter ended); False: held (the converter runs); None: no lock to ask (an
    # older Solo's folder, a file system without locks).
    try:
        import fcntl

        with open(folder / _ALIVE_LOCK, "rb") as handle:
            try:  # (shared: NFS takes it on a read-only file; the converter's exclusive lock refuses it)
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True
    except (ImportError, OSError):
        return None


# What every conversion writes (one recorded before its file list was: gguf_source.json's "files").
_CONVERSION_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                     "generation_config.json")


def _whole_conversion(folder: Path) -> bool:
    # Every file the conversion wrote is still there (a deleted chat template or generation config would
    # otherwise be run without, silently).
    try:
        record = json.loads((folder / "gguf_source.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    files = record.get("files") if isinstance(record, dict) else None
    names = files if isinstance(files, list) and all(isinstance(f, str) for f in files) else _CONVERSION_FILES
    return all((folder / name).is_file() for name in names)


def _prune_abandoned_conversions(parent: Path) -> None:
    # A conversion's temporary folder (.converting-<pid>@<host>@*) whose process is gone: a process killed, or a
    # server stopped mid-load (it exits without waiting for the load), leaves one of the size of the weights. Judged
    # by its lock (`_ALIVE_LOCK`); without one, this host's by its pid, another host's (a cache shared over the
    # network) or an older Solo's (no pid in the name) once nothing in it has changed for `_ABANDONED_AFTER_S`.
    for folder in parent.glob(".converting-*"):
        if folder.is_symlink() or not folder.is_dir():
            continue  # (not a conversion's folder: never followed)
        abandoned = _lock_says_abandoned(folder)
        if abandoned is not None:
            if abandoned:
                shutil.rmtree(folder, ignore_errors=True)
            continue
        idle_s = _idle_s(folder)
        if idle_s < _LOCK_GRACE_S:
            continue  # (no lock yet: a conversion that has just made its folder, maybe in another PID namespace)
        match = re.match(r"\.converting-(\d+)@(.*)@", folder.name)
        if match is None or match[2] != socket.gethostname():
            if idle_s > _ABANDONED_AFTER_S:
                shutil.rmtree(folder, ignore_errors=True)
            continue
        try:
            os.kill(int(match[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # alive under another user: not ours to judge
            pass


# How long another host's (or an older Solo's) conversion folder may go unchanged before it counts as abandoned: a
# conversion writes its files within minutes.
_ABANDONED_AFTER_S = 6 * 3600


def _idle_s(folder: Path) -> float:
    # Seconds since anything in `folder` last changed (0 if it cannot be read: not ours to judge).
    try:
        newest = max([folder.stat().st_mtime, *(f.stat().st_mtime for f in folder.rglob("*"))])
    except OSError:
        return 0.0
    return time.time() - newest


def _is_write_failure(exc: BaseException) -> bool:
    # A full disk or a read-only / foreign-owned cache folder, as OSError or as the Rust libraries' errors.
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)
    # (safetensors' SafetensorError and tokenizers' bare Exception carry the OS error in their text only)
    return any(text in str(exc) for text in ("os error 28", "No space left", "os error 27", "File too large"))


def _cache_write_error(parent: Path, exc: BaseException) -> str:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    if (isinstance(exc, OSError) and exc.errno == errno.EFBIG) or "os error 27" in str(exc):
        return (f"cannot write the converted GGUF model under {parent} ({reason}): the file size limit (ulimit -f) "
                "is below the model's size; raise it (ulimit -f unlimited)")
    return (f"cannot write the converted GGUF model under {parent} ({reason}); free space, fix the folder's "
            "permissions or point SOLO_CACHE_DIR at a writable folder with room")


def _mkdir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create the folder for converted GGUF files, {path} ({exc.strerror}); "
                              "point SOLO_CACHE_DIR at a writable folder") from None
    return path


def _check_special_token_ids(reader: Any, name: str) -> None:  # noqa: ANN401
    # A special token's id past the vocabulary (a file written for another tokenizer) made transformers' GGUF
    # tokenizer reader fail with a bare IndexError; named here, before the slow part.
    count = len(reader.fields["tokenizer.ggml.tokens"].data)
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):  # (those it looks up)
        field = reader.fields.get(f"tokenizer.ggml.{key}")
        if field is None or not field.data:
            continue
        value = int(field.parts[field.data[0]][0])
        if not 0 <= value < count:
            raise CheckpointError(f"{name}: tokenizer.ggml.{key} is {value}, outside its {count} tokens; the file "
                                  "is damaged or its metadata belongs to another tokenizer: re-download or re-convert "
                                  "it")


def _field(reader: Any, name: str) -> str:  # noqa: ANN401
    field = reader.fields.get(name)
    if field is None:
        raise CheckpointError(f"the GGUF file has no {name} field; it is damaged or not a model")
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def _convert(reader: Any, src: Path, out: Path, arch: str, dtype: str) -> None:  # noqa: ANN401
    # The file's metadata comes from `reader` (its GGUFReader, opened once); weights and tokenizer through
    # transformers' GGUF loader.
    import logging

    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers import logging as hf_logging
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from solo.model.config import ModelConfig
    from solo.model.store import GGUF_ARCHITECTURES

    hf_logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        config = AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name)
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise UnsupportedArchitectureError(
            f"{src.name}: GGUF architecture {arch!r} cannot be read ({exc}); Solo runs GGUF files of "
            f"{', '.join(GGUF_ARCHITECTURES)} models") from None
    except Exception as exc:  # noqa: BLE001  # (a head count of 0: modulo by zero; huggingface_hub's checks)
        raise CheckpointError(f"{src.name}: its {arch} metadata is damaged (transformers' reader failed: "
                              f"{type(exc).__name__}: {exc}); re-download the file") from None
    _head_dim_field(reader, arch, config)
    pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, int) and pad >= config.vocab_size:  # a class default (Phi3Config's 32000), not the file's
        config.pad_token_id = None
    raw = config.to_dict()
    raw["torch_dtype"] = raw["dtype"] = dtype
    if arch == "phi3":
        raw.update(_phi3_fields(reader, src, raw))
    elif arch == "gemma3":
        raw.update(_gemma3_fields(reader, src, raw))
    else:
        raw.update(_rope_scaling_fields(reader, src, arch, raw))
    try:
        ModelConfig.from_dict(raw)  # refuses an architecture Solo does not run, before the slow part
    except UnsupportedArchitectureError as exc:  # named as GGUF files name architectures
        raise UnsupportedArchitectureError(
            f"{src.name}: GGUF architecture {arch!r} is not one Solo runs ({exc}); Solo runs GGUF files of "
            f"{', '.join(GGUF_ARCHITECTURES)} models") from None
    except CheckpointError as exc:  # (named as config.json's fields: the metadata's converted config)
        raise CheckpointError(f"{src.name}: its metadata converts to an invalid model config: {exc}") from None
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001  # (metadata Solo's checks let through: a rope dimension of 0, ...)
        raise CheckpointError(f"{src.name}: its {arch} metadata is damaged (transformers could not build the model "
                              f"from it: {type(exc).__name__}: {exc}); re-download the file") from None
    try:
        tensors = load_gguf_checkpoint(str(src), return_tensors=True, model_to_load=skeleton)["tensors"]
    except NotImplementedError as exc:
        raise CheckpointError(f"{src.name} holds a tensor type the gguf package cannot dequantize ({exc}); "
                              "use an F16, BF16, Q8_0, Q4_0 or K-quant file") from None
    wanted = set(skeleton.state_dict())
    torch_dtype = getattr(torch, dtype)
    weights = {name: torch.as_tensor(t).to(torch_dtype).contiguous() for name, t in tensors.items() if name in wanted}
    missing = sorted(n for n in wanted - set(weights) if not (n == "lm_head.weight" and config.tie_word_embeddings))
    if missing:
        raise CheckpointError(f"{src.name} lacks tensor(s) for {missing[0]} (and {len(missing) - 1} more); "
                              "the file is incomplete or of another model")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    tokenizer.save_pretrained(str(out))
    token_types = _token_types(reader)
    _mark_special_tokens(out / "tokenizer.json", token_types, int(raw["vocab_size"]))
    _spm_space_prefix(out / "tokenizer.json", reader)
    if arch == "phi3":
        _phi3_special_tokens(out / "tokenizer.json", reader)
    generation = {k: raw[k] for k in ("bos_token_id", "eos_token_id") if raw.get(k) is not None}
    generation.update(_generation_fields(reader, src.name, raw.get("eos_token_id"), int(raw["vocab_size"]),
                                         token_types))
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _bring_up_to_date(folder: Path, src: Path) -> list[str]:
    """Give a folder converted by an older Solo what a conversion writes now, without converting it again.

    Format 1 -> 2: generation_config.json gains the file's end-of-turn tokens and sampling defaults. 2 -> 3: a
    SentencePiece tokenizer prefixes a space to every text (`_spm_space_prefix`). 3 -> 4: a Phi-3 file's special
    tokens take the blanks after them (`_phi3_special_tokens`). 4 -> 5: config.json gains the file's RoPE scaling
    (`_rope_scaling_fields`). A cache that cannot be written keeps the folder as it is (it still runs, as before).

    Raises:
        CheckpointError, UnsupportedArchitectureError: as `_rope_scaling_fields` (a scaling Solo cannot run as
            the file means it is refused rather than run unscaled).

    Returns:
        What changed, in words (empty: nothing).
    """
    from gguf import GGUFReader

    record_path = folder / "gguf_source.json"
    changes = []
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if record.get("format", 1) >= _CONVERSION_FORMAT:
            return []
        generation_path = folder / "generation_config.json"
        generation = json.loads(generation_path.read_text(encoding="utf-8"))
        vocab_size = int(json.loads((folder / "config.json").read_text(encoding="utf-8"))["vocab_size"])
        reader = GGUFReader(str(src))
        if record.get("format", 1) < 2:
            generation.update(_generation_fields(reader, src.name, generation.get("eos_token_id"), vocab_size,
                                                 _token_types(reader)))
            _write_json(generation_path, generation)
            changes.append("the file's end-of-turn tokens and sampling defaults")
        if record.get("format", 1) < 3 and _spm_space_prefix(folder / "tokenizer.json", reader):
            changes.append("a SentencePiece tokenizer's space prefix")
        if record.get("architecture") == "phi3" and _phi3_special_tokens(folder / "tokenizer.json", reader):
            changes.append("Phi-3's special tokens taking the blanks after them")
        if record.get("format", 1) < 5 and record.get("architecture") not in ("phi3", "gemma3"):
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
            fields = _rope_scaling_fields(reader, src, str(record.get("architecture")), config)
            if fields:
                _write_json(folder / "config.json", {**config, **fields})
                changes.append("the file's RoPE scaling")
        _write_json(record_path, {**record, "format": _CONVERSION_FORMAT})
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return changes


def _write_json(path: Path, data: Any) -> None:  # noqa: ANN401
    # Whole or not at all (a folder rewritten in place by `_bring_up_to_date` must not be left half-written).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# llama.cpp's general.sampling.* keys (written by its converter from generation_config.json) -> the
# generation_config.json fields Solo reads, with the values each takes.
_SAMPLING_KEYS = {"temp": ("temperature", lambda v: v >= 0), "top_k": ("top_k", lambda v: v >= -1),
                  "top_p": ("top_p", lambda v: 0 < v <= 1), "min_p": ("min_p", lambda v: 0 <= v <= 1),
                  "penalty_repeat": ("repetition_penalty", lambda v: v > 0)}
# Tokens llama.cpp also ends generation on, found by their text (files often store no eot id for them).
_END_OF_TURN_TEXTS = frozenset({"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                "<|end_of_text|>", "<EOT>", "<｜end▁of▁sentence｜>"})


def _generation_fields(reader: Any, name: str, eos: int | list[int] | None, vocab_size: int,  # noqa: ANN401
                       token_types: list[tuple[str, int]]) -> dict[str, Any]:
    """generation_config.json fields of a GGUF file that transformers' GGUF reader leaves out.

    Every token that ends a turn stops generation, as llama.cpp stops on its end-of-generation tokens: the
    file's eot and eom tokens and the vocabulary's well-known end-of-turn markers (Llama 3's <|eot_id|> /
    <|eom_id|>, ChatML's <|im_end|>, Gemma's <end_of_turn>, ...) join eos. The file's sampling defaults
    (llama.cpp's general.sampling.temp, top_k, top_p, min_p, penalty_repeat) become the model's, as a
    checkpoint's generation_config.json gives them (a value out of its range is left out with a warning; a
    negative temperature, llama.cpp's greedy, is 0); a default sampler Solo does not run (mirostat, XTC) is
    named in a warning. Warnings come when the file is converted.

    Args:
        reader: the file's GGUFReader; name: its name, for the warning.
        eos: the eos id(s) transformers read; vocab_size: the model's; token_types: `_token_types(reader)`.
    """
    fields: dict[str, Any] = {}
    given = [eos] if isinstance(eos, int) else list(eos or [])
    ids = list(given)
    found = [_number(reader, f"tokenizer.ggml.{kind}_token_id") for kind in ("eot", "eom")]
    found += [i for i, (text, _) in enumerate(token_types) if text in _END_OF_TURN_TEXTS]
    for token in found:
        if token is not None and 0 <= int(token) < vocab_size and int(token) not in ids:
            ids.append(int(token))
    if ids != given:
        fields["eos_token_id"] = ids
    problems = []
    for key, (field, ok) in _SAMPLING_KEYS.items():
        value = _number(reader, f"general.sampling.{key}")
        if value is None:
            continue
        value = int(value) if field == "top_k" else float(f"{value:.6g}")  # (stored as float32: 0.699999988)
        if field == "temperature" and value < 0:
            value = 0.0
        if ok(value):
            fields[field] = value
        else:
            problems.append(f"{key} {value:g} is out of range, left out")
    for key in ("mirostat", "xtc_probability"):
        value = _number(reader, f"general.sampling.{key}")
        if value:
            problems.append(f"{key} {value:g}, which Solo does not run")
    if problems:
        warnings.warn(f"{name}'s sampling defaults: {'; '.join(problems)}; its other defaults apply", SoloWarning,
                      stacklevel=2)
    return fields


def gemma3_query_pre_attn_scalar(num_layers: int, hidden_size: int, num_heads: int, head_dim: int) -> float:
    """Gemma 3's query_pre_attn_scalar as llama.cpp derives it for a gemma3 GGUF file (which does not store it).

    hidden_size / num_heads for the 62-layer 27B, else head_dim (llama.cpp's llama-model.cpp, after
    gemma_pytorch's config.py); the attention scale is its inverse square root.
    """
    return hidden_size / num_heads if num_layers == 62 else float(head_dim)


def _gemma3_fields(reader: Any, src: Path, raw: dict[str, Any]) -> dict[str, Any]:  # noqa: ANN401
    """config.json fields of a gemma3 GGUF that transformers' GGUF reader leaves out or defaults.

    llama.cpp's converter (convert_hf_to_gguf.py, Gemma3Model) writes the global layers' RoPE scaling as
    `gemma3.rope.scaling.type` / `.factor` (linear 8 on gemma-3-4b and larger); the query scale is not stored
    (`gemma3_query_pre_attn_scalar`). Without them the model would run with unscaled global RoPE and, on the
    27B, the wrong attention scale. The sliding pattern (5 sliding layers, 1 global) and the sliding layers'
    theta (10000) are transformers' defaults as they are llama.cpp's.

    Raises:
        UnsupportedArchitectureError: a RoPE scaling type other than linear.
    """
    def field(key: str) -> Any:  # noqa: ANN401
        return _metadata(reader, f"gemma3.{key}")

    head_dim = int(raw.get("head_dim") or int(raw["hidden_size"]) // int(raw["num_attention_heads"]))
    fields: dict[str, Any] = {"query_pre_attn_scalar": gemma3_query_pre_attn_scalar(
        int(raw["num_hidden_layers"]), int(raw["hidden_size"]), int(raw["num_attention_heads"]), head_dim)}
    kind, factor = field("rope.scaling.type"), field("rope.scaling.factor")
    if kind not in (None, "none") and factor not in (None, 1.0):
        if kind != "linear":
            raise UnsupportedArchitectureError(f"{src.name} scales its RoPE as {kind!r}; Solo runs gemma3 GGUF files "
                                               "with linear scaling or none")
        fields["rope_scaling"] = {"rope_type": "linear", "factor": float(factor)}
    return fields


def _rope_scaling_fields(reader: Any, src: Path, arch: str, raw: dict[str, Any]) -> dict[str, Any]:  # noqa: ANN401
    """config.json's `rope_parameters` with the RoPE scaling of a llama, mistral, qwen2, qwen3 or gemma2 GGUF file.

    transformers' GGUF reader maps none of it, so without this a model ran with unscaled RoPE (logits off from
    the first positions on, wrong past the original context). llama.cpp's converter (convert_hf_to_gguf.py)
    writes linear and YaRN scaling as `{arch}.rope.scaling.type` / `.factor` / `.original_context_length` (YaRN's
    `yarn_beta_fast` / `yarn_beta_slow` / `yarn_attn_factor` where the model sets them; without the original
    context, the file's context length, as llama.cpp takes it), and Llama 3.1's scaling
    (rope_type "llama3") as the tensor `rope_freqs.weight`: one factor per rotated frequency, each frequency
    divided by its factor (`_llama3_fields` reads the parameters back from it).

    Returns:
        {"rope_parameters": ...} (the file's theta kept), or {} for a file without scaling.

    Raises:
        UnsupportedArchitectureError: a scaling type Solo cannot run as llama.cpp does (YaRN's extrapolation
            factor or log multiplier, LongRoPE outside phi3, an unknown type).
        CheckpointError: a scaling whose values are missing or not numbers, or a `rope_freqs` tensor that is not
            Llama 3's.
    """
    def field(key: str) -> Any:  # noqa: ANN401
        return _metadata(reader, f"{arch}.rope.scaling.{key}")

    params = dict(raw.get("rope_parameters") or {})
    params.setdefault("rope_theta", float(raw.get("rope_theta") or 10000.0))
    kind, factor, original = field("type"), field("factor"), field("original_context_length")
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        if kind not in (None, "none"):
            raise UnsupportedArchitectureError(f"{src.name} scales its RoPE both as {kind!r} and by a rope_freqs "
                                               "tensor; Solo runs one or the other")
        head_dim = int(raw.get("head_dim") or int(raw["hidden_size"]) // int(raw["num_attention_heads"]))
        fields = _llama3_fields([float(f) for f in freqs.data.reshape(-1)], float(params["rope_theta"]), head_dim,
                                None if original is None else int(original), src)
        return {"rope_parameters": {**params, **fields}} if fields else {}
    if kind in (None, "none"):
        return {}
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < float("inf"):
        raise CheckpointError(f"{src.name} scales its RoPE as {kind!r} with factor {factor!r}; the factor must be a "
                              "positive number. The file is damaged or was converted wrongly")
    if kind == "linear":
        return {"rope_parameters": {**params, "rope_type": "linear", "factor": float(factor)}}
    if kind != "yarn":
        raise UnsupportedArchitectureError(f"{src.name} scales its RoPE as {kind!r}; Solo runs {arch} GGUF files with "
                                           "linear or YaRN scaling, Llama 3's rope_freqs, or none")
    if original is None:  # llama.cpp takes the trained context then (n_ctx_orig_yarn), as transformers does
        original = raw.get("max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, (int, float)) or not original >= 1:
        raise CheckpointError(f"{src.name} scales its RoPE as YaRN with neither {arch}.rope.scaling."
                              "original_context_length nor a context length; the file is damaged or was converted "
                              "wrongly")
    for key in ("yarn_ext_factor", "yarn_log_multiplier"):  # no transformers equivalent: refused, not dropped
        value = field(key)
        if value is not None and value not in (-1.0, 1.0 if key == "yarn_ext_factor" else 0.0):
            raise UnsupportedArchitectureError(f"{src.name} sets {arch}.rope.scaling.{key} = {value}; Solo runs YaRN "
                                               "as transformers does, without it")
    yarn = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": int(original)}
    for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                      ("yarn_attn_factor", "attention_factor")):
        if (value := field(key)) is not None:
            yarn[name] = float(value)
    return {"rope_parameters": {**params, **yarn}}


def llama3_rope_factors(wavelengths: Sequence[float], factor: float, low_freq_factor: float,
                        high_freq_factor: float, original: float) -> list[float]:
    """Llama 3.1's RoPE scaling as a factor per frequency, the values of llama.cpp's `rope_freqs` tensor.

    Each rotated frequency's wavelength is stretched by 1 below original / high_freq_factor, by `factor` above
    original / low_freq_factor, and by 1 / ((1 - s) / factor + s) between, s = (original / wavelength -
    low_freq_factor) / (high_freq_factor - low_freq_factor) (Meta's scaling, transformers'
    `_compute_llama3_parameters`, llama.cpp's converter).

    Args:
        wavelengths: 2 pi / inverse frequency of each rotated pair, [head_dim / 2].
    """
    out = []
    for w in wavelengths:
        if w < original / high_freq_factor:
            out.append(1.0)
        elif w > original / low_freq_factor:
            out.append(factor)
        else:
            s = (original / w - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - s) / factor + s))
    return out


def _llama3_fields(factors: list[float], theta: float, head_dim: int, original: int | None,
                   src: Path) -> dict[str, Any]:
    """Llama 3.1's RoPE scaling parameters (rope_type "llama3") that give llama.cpp's `rope_freqs` factors.

    llama.cpp's converter stores, per rotated frequency f_i = theta^(-2i/head_dim), the factor its wavelength is
    stretched by: 1 above the high-frequency band edge, `factor` below the low one, and 1 / ((1 - s) / factor + s)
    between them, with s = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    (transformers' `_compute_llama3_parameters`). The result depends on `original` only through the band edges
    original / low_freq_factor and original / high_freq_factor, so with the original context unknown (llama.cpp
    does not store it) Llama 3.1's 8192 is taken and the two band factors are read back from the factors: Llama
    3.1's own (1 and 4) where they reproduce them, else a least-squares fit of s over the in-band frequencies.

    Args:
        factors: the tensor's values, float32 [head_dim / 2].

    Returns:
        rope_parameters fields ({} where every factor is 1).

    Raises:
        CheckpointError: the factors are not of that form (another tensor length, a factor below 1, or no band
            edges that reproduce them within float32 rounding).
    """
    import math

    n = head_dim // 2
    if len(factors) != n or any(not math.isfinite(f) or f < 1 - 1e-6 for f in factors):
        raise CheckpointError(f"{src.name}'s rope_freqs tensor ({len(factors)} values) is not Llama 3's RoPE scaling "
                              f"of a head size {head_dim} (that is {n} factors of at least 1); the file is damaged "
                              "or was converted wrongly")
    factor = max(factors)
    if factor <= 1 + 1e-6:
        return {}
    original = original or 8192
    wavelengths = [2 * math.pi * theta ** (2 * i / head_dim) for i in range(n)]

    def stretch(low: float, high: float) -> list[float]:
        return llama3_rope_factors(wavelengths, factor, low, high, original)

    # In x = original / wavelength: x > high_freq_factor keeps its frequency, x < low_freq_factor takes `factor`,
    # and between them s = (x - low) / (high - low) is a line.
    xs = [original / w for w in wavelengths]
    kept = [x for x, f in zip(xs, factors, strict=True) if abs(f - 1) <= 1e-5]
    stretched = [x for x, f in zip(xs, factors, strict=True) if abs(f - factor) <= 1e-5 * factor]
    band = [(x, (1 / f - 1 / factor) / (1 - 1 / factor)) for x, f in zip(xs, factors, strict=True)
            if abs(f - 1) > 1e-5 and abs(f - factor) > 1e-5 * factor]
    candidates = [(1.0, 4.0)]  # Llama 3.1's, 3.2's and 3.3's
    if len(band) >= 2:  # least squares
        mx, ms = sum(x for x, _ in band) / len(band), sum(s for _, s in band) / len(band)
        var = sum((x - mx) ** 2 for x, _ in band)
        slope = sum((x - mx) * (s - ms) for x, s in band) / var if var > 0 else 0.0
        if slope > 0:
            low = mx - ms / slope
            candidates.append((low, low + 1 / slope))
    elif len(band) == 1:  # any line through the one point whose edges keep the other frequencies outside
        x, s = band[0]
        low = (x + max(stretched)) / 2 if stretched else x / 2  # the low edge halfway to the stretched ones
        candidates.append((low, low + (x - low) / s))
        if kept:  # or the high edge halfway to the kept ones
            high = (x + min(kept)) / 2
            candidates.append(((x - s * high) / (1 - s), high))
    elif stretched:  # no frequency in the band: edges anywhere between the kept and the stretched ones
        top = max(stretched)
        gap = (min(kept) - top) if kept else top
        candidates.append((top + gap / 3, top + 2 * gap / 3))
    for low, high in candidates:
        if 0 < low < high and all(abs(a - b) <= 1e-4 * b for a, b in zip(stretch(low, high), factors, strict=True)):
            return {"rope_type": "llama3", "factor": float(factor), "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
    raise CheckpointError(f"{src.name}'s rope_freqs tensor is not Llama 3's RoPE scaling (no frequency bands "
                          "reproduce its factors); Solo cannot run it as llama.cpp does")


def _phi3_fields(reader: Any, src: Path, raw: dict[str, Any]) -> dict[str, Any]:  # noqa: ANN401
    """config.json fields of a phi3 GGUF that transformers' GGUF reader leaves out.

    llama.cpp's converter (convert_hf_to_gguf.py, Phi3MiniModel) writes the sliding window (0: none, as
    Phi-4), the original context and LongRoPE's attention factor as keys, and the long / short factors as the
    tensors rope_factors_long / rope_factors_short; without them the model would run with plain RoPE and no
    window.

    A rotary dimension below the head size (Phi-4-mini's 96 of 128) becomes `partial_rotary_factor`.

    Raises:
        CheckpointError: only one of the two factor tensors is present, or the rotary dimension is not an
            even number of at most the head size.
    """
    from solo.model.config import longrope_attention_factor

    def number(key: str) -> float | None:
        return _number(reader, f"phi3.{key}")

    fields: dict[str, Any] = {}
    window = number("attention.sliding_window")
    if window is not None:
        fields["sliding_window"] = int(window) or None
    head_dim = int(raw["hidden_size"]) // int(raw["num_attention_heads"])
    rotary = number("rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        if not 0 < int(rotary) < head_dim or int(rotary) % 2:
            raise CheckpointError(f"{src.name} rotates {int(rotary)} of each head's {head_dim} features; RoPE needs an "
                                  "even number of at most the head size. The file is damaged or was converted wrongly")
        # Phi-4-mini: 96 of 128. Where transformers 5 reads it (rope_parameters, over the top-level field).
        partial = int(rotary) / head_dim
        fields["partial_rotary_factor"] = partial
        fields["rope_parameters"] = {**(raw.get("rope_parameters") or {}), "partial_rotary_factor": partial}
    factors = {t.name: [float(f) for f in t.data.reshape(-1)] for t in reader.tensors
               if t.name in ("rope_factors_long.weight", "rope_factors_short.weight")}
    if len(factors) == 1:
        raise CheckpointError(f"{src.name} holds {next(iter(factors))} without its pair; the file is damaged or "
                              "was converted wrongly")
    if factors:
        original = number("rope.scaling.original_context_length")
        scaling = {"rope_type": "longrope", "long_factor": factors["rope_factors_long.weight"],
                   "short_factor": factors["rope_factors_short.weight"]}
        attention = number("rope.scaling.attn_factor")
        context = int(original or raw["max_position_embeddings"])
        formula = longrope_attention_factor(int(raw["max_position_embeddings"]) / context, context)
        if attention is not None and abs(attention - formula) > 1e-6 * formula:
            scaling["attention_factor"] = float(attention)  # else computed as transformers does (float64)
        fields["rope_scaling"] = scaling
        if original is not None:
            fields["original_max_position_embeddings"] = int(original)
    return fields


def _head_dim_field(reader: Any, arch: str, config: Any) -> None:  # noqa: ANN401
    # A head's size as llama.cpp reads it, from {arch}.attention.key_length where the file has one; transformers'
    # reader maps it for some architectures only (not qwen3), so a head size other than hidden / heads was lost.
    key_length = _number(reader, f"{arch}.attention.key_length")
    heads = getattr(config, "num_attention_heads", None)
    if key_length is None or not heads:
        return
    if int(key_length) != (getattr(config, "head_dim", None) or config.hidden_size // heads):
        config.head_dim = int(key_length)


def _sentencepiece(reader: Any) -> bool:  # noqa: ANN401
    # The file's vocabulary is SentencePiece's (llama.cpp's tokenizer model "llama"; "gpt2" is BPE).
    model = reader.fields.get("tokenizer.ggml.model")
    return model is not None and bytes(model.parts[model.data[0]]) == b"llama"


def _phi3_special_tokens(path: Path, reader: Any) -> bool:  # noqa: ANN401
    """Make a Phi-3 file's special tokens take the blanks after them (`rstrip`), except <unk>, <s>, <|endoftext|>.

    As llama.cpp does for Phi-3 and Phi-3's own tokenizer.json has it: "<|user|>", a newline, then "hi" is
    [<|user|>, "▁hi"]. Phi-3 and 3.5 only: their SentencePiece vocabulary ("llama"); Phi-4-mini, a phi3 file too,
    has a BPE one and its own tokens' settings. Returns whether the file changed.
    """
    if not _sentencepiece(reader):
        return False
    data = json.loads(path.read_text(encoding="utf-8"))
    changed = False
    for token in data.get("added_tokens", []):
        if token["content"] not in ("<unk>", "<s>", "<|endoftext|>") and not token.get("rstrip"):
            token["rstrip"], changed = True, True
    if changed:
        _write_json(path, data)
    return changed


def _spm_space_prefix(path: Path, reader: Any) -> bool:  # noqa: ANN401
    """Make a SentencePiece ("llama") tokenizer prefix a space to every text, as sentencepiece and llama.cpp do.

    transformers' GGUF tokenizer writes a Metaspace pre-tokenizer with `prepend_scheme: "first"`, which adds no
    "▁" to a text that starts with a space: " one" became [697] ("▁one") where sentencepiece, llama.cpp and the
    model's own tokenizer.json give [29871, 697] ("▁", "▁one"), so indented prompts lost a space. The
    normalizer Hugging Face's Llama tokenizer.json files carry (Prepend "▁", then spaces -> "▁") does it, after
    each special token too, as llama.cpp's `tokenizer_add_space_prefix`. Files that turn the prefix off
    (`tokenizer.ggml.add_space_prefix` false) and other tokenizer models are left as they are.
    """
    prefix = reader.fields.get("tokenizer.ggml.add_space_prefix")
    if not _sentencepiece(reader):
        return False
    if prefix is not None and not bool(prefix.parts[prefix.data[0]][0]):
        return False
    data = json.loads(path.read_text(encoding="utf-8"))
    pre = data.get("pre_tokenizer") or {}
    if (data.get("normalizer") is not None or pre.get("type") != "Metaspace"
            or pre.get("prepend_scheme") not in ("first", "always") or pre.get("split")):
        return False
    space = pre.get("replacement", "\u2581")
    data["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": space}, {"type": "Replace", "pattern": {"String": " "}, "content": space}]}
    data["pre_tokenizer"] = None
    _write_json(path, data)
    return True


def _metadata(reader: Any, key: str) -> Any:  # noqa: ANN401
    # A metadata value of the file: its string or its (first) number; None where the file has none.
    from gguf import GGUFValueType

    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    return bytes(value).decode() if field.types[0] == GGUFValueType.STRING else value[0].item()


def _number(reader: Any, key: str) -> float | None:  # noqa: ANN401
    # A numeric metadata value of the file, or None where it has none (or not one number).
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    return value[0].item() if len(value) == 1 and value.dtype.kind in "iuf" else None


def _token_types(reader: Any) -> list[tuple[str, int]]:  # noqa: ANN401
    # (text, llama.cpp token type) of every vocabulary entry.
    tokens, types = reader.fields.get("tokenizer.ggml.tokens"), reader.fields.get("tokenizer.ggml.token_type")
    if tokens is None or types is None:
        return []
    texts = [bytes(tokens.parts[i]).decode("utf-8", errors="replace") for i in tokens.data]
    kinds = [int(types.parts[i][0]) for i in types.data]
    return list(zip(texts, kinds, strict=False))


def _mark_special_tokens(path: Path, token_types: list[tuple[str, int]], vocab_size: int) -> None:
    """Make the tokenizer treat the GGUF's control and user-defined tokens as llama.cpp does (never split).

    transformers' GGUF tokenizer registers only bos/eos/unk/pad as special, so a chat template's markers
    (`<|im_start|>`) would be split into pieces; it may also append a token beyond the model's vocabulary.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    added = [t for t in data.get("added_tokens", []) if t["id"] < vocab_size]
    have = {t["content"] for t in added}
    for token_id, (text, kind) in enumerate(token_types):
        if kind in (3, 4) and text not in have and token_id < vocab_size:  # CONTROL, USER_DEFINED
            added.append({"id": token_id, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": kind == 3})
    data["added_tokens"] = sorted(added, key=lambda t: t["id"])
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
