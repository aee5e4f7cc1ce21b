"""Training corpus: the Python sources of the CPython standard library installed on this machine.

The corpus is discovered through ``sysconfig`` (never a hard-coded path), third-party packages
(``site-packages`` / ``dist-packages``) are excluded, files are deduplicated by content hash and
split into train and held-out sets *by file*, using a hash of each file's path relative to the
stdlib root, so the split is deterministic and independent of discovery order or machine.
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

#: Folder names that hold third-party code rather than the standard library.
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})

#: Licence of the corpus (the CPython standard library).
CORPUS_LICENSE = "PSF-2.0 (Python Software Foundation License Version 2)"


@dataclass(frozen=True)
class SourceFile:
    """One deduplicated source file of the corpus.

    Attributes:
        rel_path: POSIX path relative to the stdlib root, e.g. ``"json/decoder.py"``.
        text: the file decoded as UTF-8, unmodified (newlines and whitespace kept byte-exact).
        sha256: hex SHA-256 of the file's raw bytes.
        n_bytes: size of the file in bytes (UTF-8), the denominator of bits per byte.
    """

    rel_path: str
    text: str
    sha256: str
    n_bytes: int


@dataclass
class Corpus:
    """The deduplicated corpus split into train and held-out files.

    Attributes:
        root: the stdlib folder the files were read from (not recorded in artefacts).
        python_version: ``platform.python_version()`` of the interpreter whose stdlib was read.
        python_implementation: e.g. ``"CPython"``.
        train: training files, sorted by ``rel_path``.
        heldout: held-out files, sorted by ``rel_path``.
        file_list_sha256: hex SHA-256 over the sorted lines ``<rel_path> TAB <sha256> LF`` of all
            kept files (train and held-out), identifying the exact corpus.
        stats: counts of files found, skipped (non-UTF-8) and removed as duplicates.
    """

    root: Path
    python_version: str
    python_implementation: str
    train: list[SourceFile]
    heldout: list[SourceFile]
    file_list_sha256: str
    stats: dict[str, int] = field(default_factory=dict)

    def describe(self) -> dict[str, object]:
        """Return a JSON-serialisable summary (no machine-specific paths).

        Returns:
            A dict with the Python version, file-list hash, file counts and byte counts.
        """
        return {
            "source": "CPython standard library (*.py, excluding site-packages)",
            "license": CORPUS_LICENSE,
            "python_version": self.python_version,
            "python_implementation": self.python_implementation,
            "file_list_sha256": self.file_list_sha256,
            "train_files": len(self.train),
            "train_bytes": sum(f.n_bytes for f in self.train),
            "heldout_files": len(self.heldout),
            "heldout_bytes": sum(f.n_bytes for f in self.heldout),
            **self.stats,
        }


def stdlib_root() -> Path:
    """Return the standard-library folder of the running interpreter.

    Returns:
        ``Path(sysconfig.get_paths()["stdlib"])``.

    Raises:
        FileNotFoundError: if that folder does not exist.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"standard library folder not found: {root}")
    return root


def path_bucket(rel_path: str, buckets: int = 1000) -> int:
    """Map a relative path to a stable bucket in ``[0, buckets)`` via SHA-256.

    Args:
        rel_path: POSIX path relative to the corpus root.
        buckets: number of buckets.

    Returns:
        The bucket index (int), identical on every machine and Python version.
    """
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % buckets


def is_heldout(rel_path: str, heldout_permille: int) -> bool:
    """Decide whether a file belongs to the held-out set.

    Args:
        rel_path: POSIX path relative to the corpus root.
        heldout_permille: held-out share in parts per thousand (e.g. 50 for 5%).

    Returns:
        True when the file is held out.
    """
    return path_bucket(rel_path) < heldout_permille


def discover_files(root: Path) -> list[Path]:
    """List the ``*.py`` files under ``root``, skipping third-party and cache folders.

    Args:
        root: the stdlib folder.

    Returns:
        Absolute paths sorted by their POSIX path relative to ``root``.
    """
    found = []
    for path in root.rglob("*.py"):
        rel_parts = path.relative_to(root).parts
        if EXCLUDED_DIRS.intersection(rel_parts) or not path.is_file():
            continue
        found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def file_list_hash(files: list[SourceFile]) -> str:
    """Hash a list of corpus files by path and content.

    Args:
        files: corpus files (any order; they are sorted by ``rel_path`` first).

    Returns:
        Hex SHA-256 of the sorted lines ``<rel_path> TAB <sha256> LF``.
    """
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.rel_path):
        h.update(f"{f.rel_path}\t{f.sha256}\n".encode())
    return h.hexdigest()


def load_corpus(root: Path | None = None, heldout_permille: int = 50, max_files: int | None = None) -> Corpus:
    """Read, deduplicate and split the corpus.

    Files that are not valid UTF-8 are skipped (a few test fixtures use other encodings on
    purpose). Of files with identical bytes the one with the smallest relative path is kept, so
    no content appears in both splits.

    Args:
        root: corpus folder; defaults to :func:`stdlib_root`.
        heldout_permille: held-out share in parts per thousand of files (by path hash).
        max_files: if set, keep only this many train files and ``max(2, max_files // 10)``
            held-out files, chosen by path hash (for quick test runs); the file-list hash then
            describes the reduced corpus.

    Returns:
        The :class:`Corpus`.

    Raises:
        FileNotFoundError: if the root does not exist.
        ValueError: if ``heldout_permille`` is outside ``[1, 999]`` or a split ends up empty.
    """
    if not 1 <= heldout_permille <= 999:
        raise ValueError(f"heldout_permille must be in [1, 999], got {heldout_permille}")
    root = stdlib_root() if root is None else Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"corpus folder not found: {root}")

    seen: set[str] = set()
    kept: list[SourceFile] = []
    n_found = n_non_utf8 = n_dupes = 0
    for path in discover_files(root):
        n_found += 1
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            n_non_utf8 += 1
            continue
        digest = hashlib.sha256(raw).hexdigest()
        if digest in seen:
            n_dupes += 1
            continue
        seen.add(digest)
        kept.append(SourceFile(path.relative_to(root).as_posix(), text, digest, len(raw)))

    train = [f for f in kept if not is_heldout(f.rel_path, heldout_permille)]
    heldout = [f for f in kept if is_heldout(f.rel_path, heldout_permille)]
    if max_files is not None:
        # A second, independent hash order picks a spread-out sample rather than one package.
        def order(f: SourceFile) -> str:
            return hashlib.sha256(("sample:" + f.rel_path).encode()).hexdigest()

        train = sorted(sorted(train, key=order)[:max_files], key=lambda f: f.rel_path)
        heldout = sorted(sorted(heldout, key=order)[: max(2, max_files // 10)], key=lambda f: f.rel_path)
    if not train or not heldout:
        raise ValueError(f"empty split: {len(train)} train files, {len(heldout)} held-out files")

    return Corpus(
        root=root,
        python_version=platform.python_version(),
        python_implementation=platform.python_implementation(),
        train=train,
        heldout=heldout,
        file_list_sha256=file_list_hash(train + heldout),
        stats={"files_found": n_found, "skipped_non_utf8": n_non_utf8, "duplicates_removed": n_dupes},
    )


def select_eval_subset(heldout: list[SourceFile], target_bytes: int = 20_000) -> list[SourceFile]:
    """Pick a small fixed subset of held-out files for cheap re-evaluation in tests.

    Files between 1 KB and 16 KB are taken in path-hash order until ``target_bytes`` is reached,
    so the subset is deterministic and mixes packages.

    Args:
        heldout: held-out files.
        target_bytes: approximate total size of the subset in bytes.

    Returns:
        The subset, sorted by ``rel_path`` (at least one file).

    Raises:
        ValueError: if ``heldout`` is empty.
    """
    if not heldout:
        raise ValueError("no held-out files to choose an evaluation subset from")
    candidates = [f for f in heldout if 1_000 <= f.n_bytes <= 16_000] or list(heldout)
    candidates.sort(key=lambda f: hashlib.sha256(("subset:" + f.rel_path).encode()).hexdigest())
    chosen: list[SourceFile] = []
    total = 0
    for f in candidates:
        if total >= target_bytes:
            break
        chosen.append(f)
        total += f.n_bytes
    return sorted(chosen, key=lambda f: f.rel_path)
