"""Finding a model folder: a local path, the bundled default model, or a Hugging Face Hub id.

Hub ids are resolved through `huggingface_hub` (its cache, then a download of the files Solo reads).
"""

from __future__ import annotations

import fnmatch
import re
import warnings
from pathlib import Path

import torch

from solo.errors import CheckpointError, ModelNotFoundError, SoloError, SoloWarning

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_BARE_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*$")  # ("gpt2": the Hub's ids from before organisations)
# "org/name:Q8_0": one quantization of a repository of GGUF files (llama.cpp's -hf and Ollama's hf.co syntax).
_HUB_PREFIX = re.compile(r"^(?:https?://)?(?:hf\.co|huggingface\.co)/", re.IGNORECASE)  # (Ollama's hf.co/org/name)
_COMMIT = re.compile(r"[0-9a-f]{40}")  # a full commit hash: a revision whose files never change
_GGUF_TAG = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.\-]*/[\w.\-]+):(?P<tag>[\w.\-]+)$")
# The quantization a repository of GGUF files named without a tag stands for, as llama.cpp's -hf and Ollama's
# hf.co/ pick it where the repository has it.
DEFAULT_GGUF_TAG = "Q4_K_M"
# Only what Solo reads: configs, tokenizer files, chat templates and safetensors weights.
HUB_FILE_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt", "*.tiktoken"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *_DTYPES)
"""Values accepted for `dtype` / `--dtype`."""


def is_hub_id(name: str) -> bool:
    """Whether `name` names a Hub model.

    "org/name", or a bare "name" the Hugging Face cache holds (`solo list` shows such models, e.g. gpt2); a bare
    name not cached is taken for a missing local folder, not asked of the Hub.
    """
    import huggingface_hub.constants as hf_constants

    if _HUB_ID.match(name):
        return True
    return bool(_BARE_HUB_ID.match(name)) and (Path(hf_constants.HF_HUB_CACHE) / f"models--{name}").is_dir()


def check_local_model(model: str | Path | None, revision: str | None = None, context_length: int | None = None
                      ) -> None:
    """Fail fast on a model reference that names a local folder which cannot load.

    Hub ids pass (what they hold is checked once downloaded); a local folder (or the bundled model, None) needs a
    config.json that parses, of an architecture Solo runs, whose context takes `context_length`. Used by
    `solo serve` before it starts listening.

    Raises:
        ModelNotFoundError: a missing folder that is not a hub id, a file that is not a GGUF file, or a
            `revision` for a local folder.
        CheckpointError: a folder without config.json, or a config.json that does not parse.
        UnsupportedArchitectureError: config.json names an architecture Solo does not implement.
        SoloError: `context_length` beyond the model's longest context.
    """
    path = Path(model).expanduser() if model is not None else None
    if path is None or path.is_dir() or path.exists() or not _HUB_ID.match(str(model)) \
            or str(model).startswith((".", "/", "~")):
        folder = resolve_model_dir(model, revision)
        from solo.model.config import ModelConfig

        config = ModelConfig.from_file(folder)
        if context_length is not None:
            config.with_context_length(context_length)


def resolve_model_dir(model: str | Path | None, revision: str | None = None) -> Path:
    """Turn what the user named into a local model folder.

    Args:
        model: a folder path, a .gguf file (converted once into Solo's cache, see `solo.model.gguf`), a Hugging
            Face Hub id ("org/name"; a snapshot without config.json that holds one GGUF file stands for it),
            "org/name:TAG" (the repository's GGUF file whose name holds TAG, e.g. Q8_0; without a tag, or with
            ":latest", a repository of several GGUF files stands for its Q4_K_M file, as llama.cpp's `-hf` and
            Ollama's `hf.co/` pick it), or None for Solo's bundled model.
        revision: hub branch, tag or commit (hub ids only).

    Returns:
        Path of a folder that exists.

    Raises:
        ModelNotFoundError: the path does not exist and is not a hub id, the hub download failed,
            (model=None) the bundled model is not installed, `model` is not a str / Path, or `revision` is
            given for a local folder or the bundled model.
        CheckpointError, UnsupportedArchitectureError: a GGUF file that is damaged or of an architecture Solo
            does not run.
    """
    if not isinstance(model, str | Path | None):
        raise ModelNotFoundError(
            f"model must be a folder path or a Hugging Face Hub id string, got {type(model).__name__}"
        )
    local = model is None or Path(model).expanduser().exists()
    if revision is not None and local:
        raise ModelNotFoundError(f"--revision / revision={revision!r} applies to Hub ids only, not to a local "
                                 "folder or the bundled model; leave it out")
    if model is None:
        from solo.model.default_model import default_model_path

        return default_model_path()
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        from solo.model.gguf import gguf_to_folder, is_gguf

        if is_gguf(path):
            return gguf_to_folder(path)  # converted once into Solo's cache
        raise ModelNotFoundError(f"{path} is a file but not a GGUF file; pass the model folder that holds "
                                 "config.json, or a .gguf file")
    repo_id, tag = split_gguf_tag(str(model))
    if str(model).lower().endswith(".gguf"):
        raise ModelNotFoundError(f"GGUF file {str(model)!r} does not exist; check the path (a Hub repository of GGUF "
                                 "files is named as org/name:Q8_0)")
    if not is_hub_id(repo_id) or repo_id.startswith((".", "/", "~")):
        raise ModelNotFoundError(
            f"model folder or file {str(model)!r} does not exist; pass a folder with config.json and safetensors "
            "weights, a .gguf file, or a Hugging Face Hub id such as 'org/name' ('org/name:Q8_0' for one "
            "quantization of a repository of GGUF files)"
        )
    from solo.model.store import cached_commit

    revision = cached_commit(repo_id, revision)  # (a short hash of a cached commit, as `solo list` shows it)
    folder = _download_from_hub(repo_id, revision, gguf_patterns(tag))
    _check_download_finished(repo_id, folder, gguf_patterns(tag))
    if tag is None and not (folder / "config.json").is_file():
        # A repository of GGUF files named without a tag: its Q4_K_M file, where it has one (`pick_gguf`), as
        # `solo pull` fetches it.
        folder = _download_from_hub(repo_id, revision, gguf_patterns(DEFAULT_GGUF_TAG))
        _check_download_finished(repo_id, folder, gguf_patterns(DEFAULT_GGUF_TAG))
    if tag is not None or not (folder / "config.json").is_file():
        gguf = pick_gguf(folder, repo_id, tag)
        if gguf is None:
            raise ModelNotFoundError(
                f"{repo_id} has no config.json (Solo reads safetensors checkpoints and GGUF files) and no GGUF "
                f"file was fetched; for a repository of GGUF files name one quantization: {repo_id}:Q8_0")
        from solo.model.gguf import gguf_to_folder

        return gguf_to_folder(gguf)  # converted once into Solo's cache
    return folder


def split_gguf_tag(model: str) -> tuple[str, str | None]:
    """Split "org/name:TAG" into ("org/name", "TAG"); anything else is (model, None).

    TAG names one quantization of a repository of GGUF files, as llama.cpp's `-hf` and Ollama's `hf.co/` do.
    Ollama's forms are taken too: an "hf.co/" (or "huggingface.co/", with or without https://) prefix is
    dropped, and ":latest", Ollama's default tag, names no quantization.
    """
    match = _HUB_PREFIX.match(model)
    if match and (_GGUF_TAG.match(model[match.end():]) or _HUB_ID.match(model[match.end():])):
        model = model[match.end():]
    match = _GGUF_TAG.match(model)
    if match and match["tag"].lower() == "latest":
        return match["repo"], None
    return (match["repo"], match["tag"]) if match else (model, None)


def gguf_patterns(tag: str | None) -> list[str]:
    """Download patterns for the GGUF files whose names hold `tag` as a word; [] for None.

    In the tag's case, upper or lower: "F16" fetches model-F16.gguf, not model-BF16.gguf.
    """
    if tag is None:
        return []
    edge = "[!A-Za-z0-9]"
    return sorted({p.format(t=t, e=edge) for t in (tag, tag.upper(), tag.lower())
                   for p in ("{t}.gguf", "{t}{e}*.gguf", "*{e}{t}.gguf", "*{e}{t}{e}*.gguf")})


def holds_tag(name: str, tag: str) -> bool:
    """Whether a GGUF file's path holds `tag` (a quantization such as Q8_0) as a word, in any case.

    "F16" is not in "model-BF16.gguf".
    """
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(tag)}(?![A-Za-z0-9])", name, re.IGNORECASE) is not None


def pick_gguf(folder: Path, repo_id: str, tag: str | None) -> Path | None:
    """The GGUF file of a Hub snapshot that a model name stands for.

    Args:
        folder: the snapshot folder.
        repo_id: "org/name", for messages.
        tag: a quantization the file name must hold (case-insensitive), or None for any (of several files, the
            one holding Q4_K_M, `DEFAULT_GGUF_TAG`).

    Returns:
        The one GGUF file that matches, or None when there is none and no tag was given.

    Raises:
        ModelNotFoundError: several files match (the message lists them and how to name one), or none
            matches the tag.
    """
    from solo.model.gguf import is_projector, is_split_part

    files = sorted(f for f in folder.rglob("*.gguf") if not is_projector(f))  # (never the model's file)
    if tag is not None:
        files = [f for f in files if holds_tag(str(f.relative_to(folder)), tag)]
    elif len(files) > 1:  # as llama.cpp's -hf and Ollama's hf.co/ without a tag
        files = [f for f in files if holds_tag(str(f.relative_to(folder)), DEFAULT_GGUF_TAG)] or files
    if len(files) == 1:
        return files[0]
    if len(files) > 1:
        names = ", ".join(str(f.relative_to(folder)) for f in files)
        if all(is_split_part(f) for f in files):
            raise ModelNotFoundError(f"{repo_id} stores this model split into parts ({names}); Solo runs single GGUF "
                                     "files: merge them (llama-gguf-split --merge) and pass the merged file")
        default = tag is None and holds_tag(str(files[0].relative_to(folder)), DEFAULT_GGUF_TAG)
        hint = f"{repo_id}:<quantization>" if tag is None and not default else \
            f"a longer tag, or the path of one of them in {folder}"
        which = f" matching {tag!r}" if tag is not None else f" matching {DEFAULT_GGUF_TAG}, the default" if default \
            else f" and none is {DEFAULT_GGUF_TAG}, the default"
        raise ModelNotFoundError(f"{repo_id} holds several GGUF files ({names}){which}; name one as {hint}")
    if tag is not None:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:  # only the cache was looked at
            raise ModelNotFoundError(f"{repo_id} has no GGUF file whose name holds {tag!r} in the Hugging Face cache, "
                                     f"and HF_HUB_OFFLINE keeps Solo from asking the Hub; `solo pull {repo_id}:{tag}` "
                                     "online downloads it")
        raise ModelNotFoundError(f"{repo_id} has no GGUF file whose name holds {tag!r}; check the quantization "
                                 "against the repository's file list")
    return None


def _download_from_hub(repo_id: str, revision: str | None, extra_patterns: list[str] | None = None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    patterns = [*HUB_FILE_PATTERNS, *(extra_patterns or [])]
    if revision is not None and _COMMIT.fullmatch(revision):
        # A commit's files never change: a complete cached snapshot needs no Hub call (offline, asking the Hub
        # for its file list retried for about 25 s before falling back to the cache).
        try:
            folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns,
                                            local_files_only=True))
            if _looks_complete(folder, extra_patterns):
                return folder
        except (LocalEntryNotFoundError, OSError, ValueError):
            pass  # not cached: ask the Hub
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"{repo_id!r} is neither a local folder nor a model on the Hugging Face Hub (or it is gated: "
            "log in with `hf auth login`); check the name"
        ) from None
    except LocalEntryNotFoundError:
        _refuse_damaged(repo_id, None)
        from solo.model.store import cached_revision_names

        cached = cached_revision_names(repo_id)
        if cached:  # the model is cached, only not at this revision (main, without --revision)
            raise ModelNotFoundError(
                f"revision {revision or 'main'!r} of {repo_id!r} is not in the Hugging Face cache (cached: "
                f"{', '.join(cached)}), and the Hub cannot be reached; connect to the network or pass a cached "
                "--revision"
            ) from None
        raise ModelNotFoundError(
            f"{repo_id!r} is not a local folder and is not in the Hugging Face cache, and the Hub cannot be "
            "reached; connect to the network or pass a local model folder"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ModelNotFoundError(
            f"could not download {repo_id!r} from the Hugging Face Hub ({exc}); pass a local model folder"
        ) from None


def broken_links(folder: Path, patterns: list[str]) -> list[str]:
    """The files of a Hub snapshot that `patterns` ask for whose blob is gone (links to nothing), sorted.

    Paths relative to `folder`, matched as huggingface_hub's allow_patterns match them ("dir/" is "dir/*").
    """
    wanted = [w + "*" if w.endswith("/") else w for w in patterns]
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_symlink() and not p.exists()
                  and any(fnmatch.fnmatch(str(p.relative_to(folder)), w) for w in wanted))


def _check_download_finished(repo_id: str, folder: Path, patterns: list[str]) -> None:
    # Offline, huggingface_hub hands back a snapshot whose download stopped part-way (its files were then
    # reported missing one by one: "no tokenizer", "lacks tensor ..."); online it would have resumed it.
    from solo.model.store import human_size, partial_downloads

    # (a missing file this name does not need is no reason to refuse)
    broken = broken_links(folder, [*HUB_FILE_PATTERNS, *patterns])
    if broken:  # a blob deleted behind the snapshot's link, which the Hub would have mended
        _refuse_damaged(repo_id, f"{broken[0]}'s file is missing")
    if _looks_complete(folder, patterns):
        return
    try:
        partial = partial_downloads().get(repo_id)
    except SoloError:  # a cache that cannot be read: the load reports what is missing
        return
    if partial is not None:
        raise ModelNotFoundError(f"the download of {repo_id} was interrupted ({human_size(partial)} of partial files "
                                 "in the Hugging Face cache) and the Hub cannot be reached to finish it; `solo pull "
                                 f"{repo_id}` resumes it once online (`solo rm {repo_id}` deletes it)")


def _refuse_damaged(repo_id: str, why: str | None) -> None:
    # As `solo list` names a cache folder huggingface_hub cannot read, with the two commands that mend it.
    from solo.model.store import damaged_repos

    if why is None:
        try:
            if repo_id not in damaged_repos():
                return
        except SoloError:  # a cache that cannot be read: the caller's message stands
            return
        why = "a file or a ref is missing"
    raise damaged_cache_error(repo_id, why)


def damaged_cache_error(repo_id: str, why: str, pull_name: str | None = None) -> ModelNotFoundError:
    """The error for a cached model that cannot be read or served whole offline, with the commands that mend it.

    Named as `solo list` names such a folder.

    Args:
        repo_id: "org/name".
        why: what is damaged ("config.json's file is missing").
        pull_name: the name to pull again ("org/name:Q8_0"; default `repo_id`).
    """
    return ModelNotFoundError(f"the cached {repo_id} is damaged ({why}) and the Hub cannot be reached to mend it; "
                              f"`solo pull {pull_name or repo_id}` online downloads it again (`solo rm {repo_id}` "
                              "deletes it)")


def _looks_complete(folder: Path, gguf_patterns: list[str] | None = None) -> bool:
    # The GGUF file a tag asks for; else a GGUF file, or config.json + a tokenizer (any form `Tokenizer` loads) +
    # every safetensors shard the index lists (or one file).
    if gguf_patterns:
        return any(fnmatch.fnmatch(f.name, p) for f in folder.rglob("*.gguf") for p in gguf_patterns)
    if any(folder.rglob("*.gguf")):
        return True
    from solo.tokenizer import has_tokenizer_files

    if not (folder / "config.json").is_file() or not has_tokenizer_files(folder):
        return False
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():  # (read before an index, as `checkpoint_files` does)
        return True
    if index.is_file():
        from solo.model.weights import index_shards

        try:
            shards = index_shards(index)
        except CheckpointError:
            return False
        return all((folder / shard).is_file() for shard in shards)
    return any(folder.glob("*.safetensors"))


def resolve_dtype(dtype: str | torch.dtype, checkpoint_dtype: str | None,
                  weights_dtype: str | None = None) -> torch.dtype:
    """The dtype to load weights in.

    Args:
        dtype: "auto" (the checkpoint's own dtype, float32 when it names none), "float32", "bfloat16",
            "float16", or a torch dtype.
        checkpoint_dtype: `torch_dtype` from config.json, or None.
        weights_dtype: the dtype of the weights themselves (`checkpoint_dtype` of solo.model.weights), which
            "auto" takes where config.json names none, transformers' "auto", or a dtype outside the three.

    Returns:
        torch.float32, torch.bfloat16 or torch.float16 ("auto" with a checkpoint dtype outside these three
        gives the weights' dtype, else float32, with a SoloWarning that says so).

    Raises:
        SoloError: an unknown dtype name, or a torch dtype other than those three.
    """
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise SoloError(f"unsupported dtype {dtype}; choose one of {', '.join(DTYPE_CHOICES)}")
        return dtype
    name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}.get(
        dtype, dtype
    )
    if name == "auto":
        if str(checkpoint_dtype) in _DTYPES:
            return _DTYPES[str(checkpoint_dtype)]
        taken = weights_dtype if weights_dtype in _DTYPES else "float32"
        if checkpoint_dtype not in (None, "auto"):
            own = ", the weights' own" if taken == weights_dtype else ""
            warnings.warn(f"config.json names the dtype {str(checkpoint_dtype)!r:.40}, which Solo does not load "
                          f"weights in; loading in {taken}{own} (pass dtype / --dtype to choose one of "
                          f"{', '.join(_DTYPES)})", SoloWarning, stacklevel=3)
        return _DTYPES[taken]
    if name not in _DTYPES:
        raise SoloError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    return _DTYPES[name]
