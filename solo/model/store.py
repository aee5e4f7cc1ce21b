"""Models on this machine: `solo pull`, `solo list`, `solo rm` over the Hugging Face cache.

Downloads go through `huggingface_hub` (progress bars, resumed after an interruption, shared with every other
tool that uses the cache: $HF_HUB_CACHE, by default ~/.cache/huggingface/hub). Only the files Solo reads are
fetched (configs, tokenizer, safetensors), plus the files an --include pattern names (e.g. one GGUF file).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from solo.errors import ModelNotFoundError, SoloError, undeletable

# GGUF architectures whose tensors Solo runs (through solo.model.gguf).
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")


@dataclass
class CachedModel:
    """One revision of a model in the cache.

    Attributes:
        repo_id: "org/name", or "org/name:TAG" to fetch also the GGUF files whose names hold TAG (e.g. Q8_0); a
            repository of GGUF files (no config.json) named without a tag gets its Q4_K_M file.
        revision: the branch/tag names pointing at it ("main"), else the short commit hash.
        commit: the full commit hash.
        path: the snapshot folder.
        size_bytes: bytes on disk of this revision's files.
        architecture: from config.json (e.g. "LlamaForCausalLM"), "gguf:<arch>" for GGUF files, or "?".
        supported: whether Solo can run it.
        reason: why not (empty when supported).
        gguf_files: GGUF files of the snapshot (pass one to `solo run`).
    """

    repo_id: str
    revision: str
    commit: str
    path: str
    size_bytes: int
    architecture: str
    supported: bool
    reason: str
    gguf_files: list[str]

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def _cache(cache_dir: str | Path | None) -> str:
    # Read at call time (huggingface_hub binds some defaults at import).
    import huggingface_hub.constants as hf_constants

    return str(cache_dir) if cache_dir is not None else hf_constants.HF_HUB_CACHE


def inspect_folder(folder: Path) -> tuple[str, bool, str, list[str]]:
    """What a model folder holds: (architecture, supported, reason, GGUF files).

    Reads config.json and the GGUF headers only; never loads weights.
    """
    from solo.errors import SoloError as _SoloError
    from solo.model.gguf import is_projector, is_split_part

    found = sorted(str(p) for p in folder.rglob("*.gguf"))
    ggufs = [g for g in found if not is_projector(g)]  # (a multimodal projector is never the model's file)
    config = folder / "config.json"
    if config.is_file():
        try:
            raw = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            return "?", False, f"config.json does not parse ({exc})", ggufs
        if not isinstance(raw, dict):
            return "?", False, "config.json is not a JSON object", ggufs
        from solo.model.config import ModelConfig, listed_architectures

        names = listed_architectures(raw) or [raw.get("model_type") or "?"]
        names = names if isinstance(names, list) else ["?"]
        try:

            ModelConfig.from_dict(raw)
        except _SoloError as exc:
            return str(names[0]), False, str(exc), ggufs
        except Exception as exc:  # noqa: BLE001  # an odd but parseable config: one model listed as not runnable
            return str(names[0]), False, f"config.json cannot be read ({type(exc).__name__}: {exc})", ggufs
        from solo.model.weights import checkpoint_files

        try:  # what loading reads first: every shard the index lists (a link whose file is gone is none)
            checkpoint_files(folder)
        except _SoloError as exc:
            return str(names[0]), False, str(exc), ggufs
        from solo.tokenizer import has_tokenizer_files

        if not has_tokenizer_files(folder):
            return str(names[0]), False, "no tokenizer (tokenizer.json, tokenizer.model, or vocab.json with " \
                "merges.txt)", ggufs
        return str(names[0]), True, "", ggufs
    if found and not ggufs:
        return "gguf:?", False, "its GGUF files are multimodal projectors (mmproj), not a language model", ggufs
    if ggufs:
        whole = [g for g in ggufs if not is_split_part(g)]
        if not whole:
            return "gguf:?", False, "its GGUF files are parts of a split file; merge them (llama-gguf-split --merge)", \
                ggufs
        archs = [_gguf_architecture(Path(g)) for g in whole]
        runnable = [a for a in archs if a in GGUF_ARCHITECTURES]
        if runnable:  # a file Solo runs (`solo run ORG/NAME:TAG` picks one)
            return f"gguf:{runnable[0]}", True, "", ggufs
        return f"gguf:{archs[0]}", False, f"GGUF architecture {archs[0]!r} is not one Solo runs", ggufs
    return "?", False, "no config.json and no GGUF file", ggufs


def _gguf_architecture(path: Path) -> str:
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(path)).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except Exception:  # noqa: BLE001  # a damaged or partial file: listed as unknown, never a crash
        return "?"


def pull(repo_id: str, revision: str | None = None, include: list[str] | None = None,
         cache_dir: str | Path | None = None) -> Path:
    """Download a model from the Hugging Face Hub into the cache (resuming a partial download).

    Args:
        repo_id: "org/name", or "org/name:TAG" to fetch also the GGUF files whose names hold TAG (e.g. Q8_0); a
            repository of GGUF files (no config.json) named without a tag gets its Q4_K_M file.
        revision: branch, tag or commit (None: main).
        include: extra glob patterns to fetch besides Solo's files, e.g. ["*Q8_0.gguf"].
        cache_dir: the cache folder (None: huggingface_hub's default, $HF_HUB_CACHE).

    Returns:
        The snapshot folder.

    Raises:
        ModelNotFoundError: the repository does not exist (or is gated), or the Hub cannot be reached.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from solo.model.hub import (
        _BARE_HUB_ID,
        _HUB_ID,
        DEFAULT_GGUF_TAG,
        HUB_FILE_PATTERNS,
        broken_links,
        damaged_cache_error,
        gguf_patterns,
        split_gguf_tag,
    )

    if Path(repo_id).expanduser().exists():  # (as solo run takes it first: a local folder or GGUF file)
        raise ModelNotFoundError(f"{repo_id!r} is a local path, which needs no pull: give it to solo run / serve "
                                 "as it is")
    repo_id, tag = split_gguf_tag(repo_id)
    if not (_HUB_ID.match(repo_id) or _BARE_HUB_ID.match(repo_id)):  # ("gpt2": ids from before organisations)
        raise ModelNotFoundError(f"{repo_id!r} is not a Hugging Face Hub id; give one such as 'org/name' "
                                 "('org/name:Q8_0' for one quantization of a repository of GGUF files)")
    revision = cached_commit(repo_id, revision, cache_dir)
    try:
        patterns = [*HUB_FILE_PATTERNS, *gguf_patterns(tag), *(include or [])]
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=_cache(cache_dir),
                                        allow_patterns=patterns))
        if tag is None and not include and not (folder / "config.json").is_file():
            # A repository of GGUF files named without a tag: its Q4_K_M file, which `solo run` then picks.
            patterns = [*HUB_FILE_PATTERNS, *gguf_patterns(DEFAULT_GGUF_TAG)]
            folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=_cache(cache_dir),
                                            allow_patterns=patterns))
        # A blob deleted behind the link of a file this pull wants (offline: not mended), as `solo run` says; a
        # file it does not want (another tag's GGUF, a README) is no reason.
        broken = broken_links(folder, patterns)
        if broken:
            raise damaged_cache_error(repo_id, f"{broken[0]}'s file is missing",
                                      f"{repo_id}:{tag}" if tag is not None else repo_id)
        return folder
    except GatedRepoError:
        raise ModelNotFoundError(f"{repo_id} is gated: accept its terms on the Hub, then log in with "
                                 "`hf auth login`") from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(f"{repo_id!r} is not a model on the Hugging Face Hub (or it is private: log in "
                                 "with `hf auth login`); check the name") from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(f"{repo_id} has no revision {revision!r}; check --revision") from None
    except LocalEntryNotFoundError:
        cached = cached_revision_names(repo_id, cache_dir)
        if cached:  # cached, only not at the revision asked (main without --revision)
            raise ModelNotFoundError(f"the Hugging Face Hub cannot be reached and {repo_id} is cached at "
                                     f"{', '.join(cached)} only, not at {revision or 'main'}; pass --revision "
                                     f"{cached[0]}, or connect to the network") from None
        damaged = damaged_repos(cache_dir).get(repo_id)
        if damaged is not None:  # (as solo list names it)
            raise damaged_cache_error(repo_id, f"a file or a ref is missing: {damaged}") from None
        raise ModelNotFoundError(f"the Hugging Face Hub cannot be reached and {repo_id} is not in the cache; "
                                 "connect to the network and run solo pull again (it resumes)") from None
    except (HfHubHTTPError, OSError) as exc:
        raise ModelNotFoundError(f"could not download {repo_id} ({exc}); run solo pull again to resume") from None


def list_models(cache_dir: str | Path | None = None) -> list[CachedModel]:
    """Every model revision in the cache, sorted by repository id.

    Raises:
        SoloError: the cache folder exists but cannot be read.
    """
    from huggingface_hub.errors import CorruptedCacheException

    try:
        info = _scan(cache_dir)
    except (CorruptedCacheException, OSError) as exc:
        raise SoloError(f"the Hugging Face cache cannot be read ({exc})") from None
    if info is None:
        return []
    found = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            arch, ok, reason, ggufs = inspect_folder(Path(rev.snapshot_path))
            name = ",".join(sorted(rev.refs)) or rev.commit_hash[:12]
            found.append(CachedModel(repo.repo_id, name, rev.commit_hash, str(rev.snapshot_path), rev.size_on_disk,
                                     arch, ok, reason, ggufs))
    return found


def _partial_blobs(cache_dir: str | Path | None) -> dict[str, list[Path]]:
    # huggingface_hub writes a file being downloaded as blobs/<hash>.incomplete in the repo's cache folder
    # (models--org--name) and renames it when done; scan_cache_dir does not count these.
    found: dict[str, list[Path]] = {}
    for folder in Path(_cache(cache_dir)).glob("models--*"):
        parts = folder.name.split("--", 2)[1:]  # models--org--name -> org, name ("models--gpt2": gpt2)
        blobs = sorted((folder / "blobs").glob("*.incomplete"))
        if parts and blobs:
            found["/".join(parts)] = blobs
    return found


def _size(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except OSError:  # finished or deleted meanwhile
            pass
    return total


def _repo_folders(cache_dir: str | Path | None) -> dict[str, Path]:
    # Every model repository folder of the cache (models--org--name -> "org/name"), scanned or not.
    found = {}
    for folder in Path(_cache(cache_dir)).glob("models--*"):
        parts = folder.name.split("--", 2)[1:]
        if parts and folder.is_dir():
            found["/".join(parts)] = folder
    return found


def _scan(cache_dir: str | Path | None) -> Any:  # noqa: ANN401
    # huggingface_hub's view of the cache (HFCacheInfo), or None where there is no cache folder.
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        return scan_cache_dir(_cache(cache_dir))
    except CacheNotFound:
        return None
    except (ValueError, OSError) as exc:  # a file where the folder should be, a folder that cannot be listed
        raise SoloError(f"the Hugging Face cache {_cache(cache_dir)} cannot be read ({exc}); point HF_HUB_CACHE (or "
                        "HF_HOME) at a cache folder") from None


def _scanned_repo_ids(cache_dir: str | Path | None) -> set[str]:
    info = _scan(cache_dir)
    return {r.repo_id for r in info.repos if r.repo_type == "model"} if info is not None else set()


def damaged_repos(cache_dir: str | Path | None = None) -> dict[str, Path]:
    """Model repositories whose cache folder huggingface_hub cannot read ("org/name" -> folder).

    A blob deleted behind a snapshot's link, refs without snapshots: `scan_cache_dir` leaves such a repository
    out (it reports it as corrupted), so `solo list` names it apart and `solo rm` deletes its folder. A folder
    holding only an interrupted download is not one (`partial_downloads`).
    """
    scanned, partial = _scanned_repo_ids(cache_dir), _partial_blobs(cache_dir)
    return {repo: folder for repo, folder in sorted(_repo_folders(cache_dir).items())
            if repo not in scanned and repo not in partial}


def _folder_size(folder: Path) -> int:
    return _size([p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()])


def partial_downloads(cache_dir: str | Path | None = None) -> dict[str, int]:
    """Bytes of interrupted downloads per model repository ("org/name" -> bytes), which `solo list` does not count.

    `solo pull` of the repository resumes them; `solo rm` of it deletes them.
    """
    return {repo: size for repo, blobs in sorted(_partial_blobs(cache_dir).items()) if (size := _size(blobs))}


def remove(repo_id: str, revision: str | None = None, cache_dir: str | Path | None = None) -> int:
    """Delete a model (every revision, or one) from the cache.

    Args:
        repo_id: "org/name", or "org/name:TAG" for only the GGUF files whose names hold TAG (e.g. Q8_0), as
            `solo run org/name:TAG` picks one: the rest of the repository stays.
        revision: a branch/tag name or a commit hash (or its first 4+ characters: `cached_revisions_named`);
            None removes every revision.
        cache_dir: the cache folder (None: huggingface_hub's default).

    Returns:
        The bytes freed (with Solo's converted folders of the GGUF files deleted, and, when every revision goes,
        the repository's interrupted downloads: `partial_downloads`). A repository folder huggingface_hub cannot
        read (`damaged_repos`) or that holds only an interrupted download is deleted whole.

    Raises:
        ModelNotFoundError: the model (or that revision, or a GGUF file holding TAG) is not in the cache.
        SoloError: a file could not be deleted (a read-only cache, or another user's); the message names it.
    """
    try:
        return _remove(repo_id, revision, cache_dir)
    except OSError as exc:
        raise undeletable(f"{repo_id} from the Hugging Face cache", exc, "HF_HOME") from None


def _remove(repo_id: str, revision: str | None, cache_dir: str | Path | None) -> int:
    from solo.model.hub import split_gguf_tag

    repo_id, tag = split_gguf_tag(repo_id)
    info = _scan(cache_dir)
    repo = next((r for r in (info.repos if info else []) if r.repo_id == repo_id and r.repo_type == "model"), None)
    partial = _partial_blobs(cache_dir).get(repo_id, []) if revision is None else []
    folder = _repo_folders(cache_dir).get(repo_id)
    if repo is None and folder is not None and revision is None and tag is None:
        # Interrupted before any file was complete, or damaged (scan_cache_dir cannot read it): the whole folder.
        freed = _folder_size(folder)
        shutil.rmtree(folder)  # (an error is reported, never a folder that is still there)
        return freed
    if repo is None:
        local = " (a local folder or file is not Solo's to remove: delete it yourself)" \
            if Path(repo_id).expanduser().exists() else ""
        raise ModelNotFoundError(f"{repo_id} is not in the Hugging Face cache{local}; `solo list` shows what is")
    revisions = list(repo.revisions) if revision is None else cached_revisions_named(repo, revision)
    if not revisions:
        raise ModelNotFoundError(f"{repo_id} has no cached revision {revision!r}; `solo list` shows what is")
    if tag is not None:
        return _remove_gguf_files(repo_id, Path(repo.repo_path), [Path(r.snapshot_path) for r in revisions], tag)
    # delete_revisions takes bare commit hashes and deletes them in every cached repo that holds one (mirrors
    # and forks share commits): scope it to this repo.
    scoped = dataclasses.replace(info, repos=frozenset({repo}))  # type: ignore[arg-type]
    strategy = scoped.delete_revisions(*(r.commit_hash for r in revisions))
    partial_freed = _delete_files(partial)  # first: deleting every revision may take the repo folder with them
    strategy.execute()
    from solo.model.gguf import prune_conversions

    # Solo's converted folders of the GGUF files just deleted.
    return (strategy.expected_freed_size + prune_conversions(under=[Path(r.snapshot_path) for r in revisions])
            + partial_freed)


def cached_revision_names(repo_id: str, cache_dir: str | Path | None = None) -> list[str]:
    """The cached revisions of a model as `solo list` names them (ref names, else a short commit hash).

    Empty where none is cached or the cache cannot be read (nothing to name).
    """
    try:
        return [m.revision for m in list_models(cache_dir) if m.repo_id == repo_id]
    except SoloError:
        return []


def _check_revision(revision: str) -> None:
    if not revision.strip():
        raise SoloError("--revision is empty; give a branch, a tag or a commit hash (`solo list` shows the cached "
                        "ones)")


def cached_commit(repo_id: str, revision: str | None, cache_dir: str | Path | None = None) -> str | None:
    """`revision` as huggingface_hub takes it.

    A short commit hash that begins one cached commit of `repo_id` (as `solo list` shows them) becomes that
    commit's whole hash; anything else is returned as it is.

    Raises:
        SoloError: an empty revision, or a short hash that begins several cached commits.
    """
    if revision is None:
        return None
    _check_revision(revision)
    if not 4 <= len(revision) < 40 or any(c not in "0123456789abcdef" for c in revision.lower()):
        return revision
    try:
        info = _scan(cache_dir)
    except SoloError:
        return revision
    repo = next((r for r in (info.repos if info else []) if r.repo_id == repo_id and r.repo_type == "model"), None)
    named = cached_revisions_named(repo, revision) if repo is not None else []
    return named[0].commit_hash if len(named) == 1 and revision not in named[0].refs else revision


def cached_revisions_named(repo: Any, revision: str) -> list[Any]:  # noqa: ANN401
    """The cached revisions of `repo` (huggingface_hub's CachedRepoInfo) that `revision` names.

    A branch or tag name names its revision; otherwise a commit hash, whole or its first 4 or more characters
    (as git takes a short hash), names the one cached commit it begins.

    Raises:
        SoloError: an empty revision, or a short hash that begins several cached commits (the message lists
            them: give more of the hash).
    """
    _check_revision(revision)
    named = [r for r in repo.revisions if revision in r.refs]
    if named:
        return named
    begun = [r for r in repo.revisions if r.commit_hash == revision
             or (len(revision) >= 4 and r.commit_hash.startswith(revision.lower()))]
    if len(begun) > 1:
        hashes = ", ".join(sorted(r.commit_hash[:12] for r in begun))
        raise SoloError(f"revision {revision!r} begins {len(begun)} cached commits of {repo.repo_id} ({hashes}); give "
                        "more of the hash")
    return begun


def _remove_gguf_files(repo_id: str, repo_path: Path, snapshots: list[Path], tag: str) -> int:
    # The snapshots' GGUF files holding `tag`: their links, the blobs no other snapshot links to, and Solo's
    # conversions of them.
    from solo.model.gguf import prune_conversions
    from solo.model.hub import holds_tag

    files = [f for snapshot in snapshots for f in snapshot.rglob("*.gguf") if holds_tag(str(f.relative_to(snapshot)),
                                                                                        tag)]
    if not files:
        raise ModelNotFoundError(f"{repo_id} has no cached GGUF file whose name holds {tag!r}; `solo list` shows "
                                 f"what is cached (`solo rm {repo_id}` deletes the whole repository)")
    freed = 0
    blobs = set()
    for f in files:
        if f.is_symlink():
            blobs.add(f.resolve())
        else:  # a cache without symlinks (Windows without developer mode) holds copies
            freed += f.stat().st_size
        f.unlink()
    kept = {f.resolve() for f in (repo_path / "snapshots").rglob("*") if f.is_symlink()}
    store = (repo_path / "blobs").resolve()
    freed += _delete_files([b for b in blobs - kept if b.is_relative_to(store)])  # (a link to a user's file: kept)
    return freed + prune_conversions(under=snapshots)


def _delete_files(blobs: list[Path]) -> int:
    freed = 0
    for blob in blobs:
        try:
            size = blob.stat().st_size
            blob.unlink()
        except OSError:  # finished or deleted meanwhile
            continue
        freed += size
    return freed


def human_size(size_bytes: int) -> str:
    """1536 -> '1.5 KB' (decimal units, as `ollama list` and the Hub show sizes)."""
    if size_bytes < 1000:
        return f"{size_bytes} B"
    size = float(size_bytes)
    for name in ("KB", "MB", "GB"):
        size /= 1000
        if size < 1000:
            return f"{size:.1f} {name}"
    return f"{size / 1000:.1f} TB"
