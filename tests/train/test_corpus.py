import hashlib
from pathlib import Path

import pytest

from solo.train.corpus import file_list_hash, is_heldout, load_corpus, select_eval_subset


def _write(root: Path, rel: str, data: bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.fixture()
def fake_stdlib(tmp_path: Path) -> Path:
    root = tmp_path / "lib"
    for i in range(60):
        _write(root, f"pkg{i % 5}/mod_{i}.py", f"def f_{i}(x):\n    return x + {i}\n".encode())
    _write(root, "dupe_a.py", b"X = 1\n")
    _write(root, "zz/dupe_b.py", b"X = 1\n")
    _write(root, "latin1.py", "s = 'caf\xe9'\n".encode("latin-1"))
    _write(root, "site-packages/third_party.py", b"import this\n")
    _write(root, "notes.txt", b"not python\n")
    return root


def test_split_is_deterministic_and_disjoint(fake_stdlib: Path) -> None:
    a = load_corpus(fake_stdlib, heldout_permille=200)
    b = load_corpus(fake_stdlib, heldout_permille=200)
    train, held = {f.rel_path for f in a.train}, {f.rel_path for f in a.heldout}
    assert train and held and not train & held
    assert [f.rel_path for f in b.train] == sorted(train)
    assert [f.rel_path for f in b.heldout] == sorted(held)
    assert a.file_list_sha256 == b.file_list_sha256
    # Membership depends on the path alone, not on which other files exist.
    assert all(is_heldout(p, 200) for p in held) and not any(is_heldout(p, 200) for p in train)


def test_dedup_encoding_and_exclusions(fake_stdlib: Path) -> None:
    c = load_corpus(fake_stdlib, heldout_permille=200)
    paths = {f.rel_path for f in c.train + c.heldout}
    assert "dupe_a.py" in paths and "zz/dupe_b.py" not in paths
    assert "latin1.py" not in paths
    assert not any("site-packages" in p or p.endswith(".txt") for p in paths)
    assert c.stats == {"files_found": 63, "skipped_non_utf8": 1, "duplicates_removed": 1}
    hashes = [f.sha256 for f in c.train + c.heldout]
    assert len(hashes) == len(set(hashes))
    f = c.train[0]
    assert f.sha256 == hashlib.sha256(f.text.encode()).hexdigest() and f.n_bytes == len(f.text.encode())


def test_file_list_hash_tracks_content(fake_stdlib: Path) -> None:
    before = load_corpus(fake_stdlib, heldout_permille=200).file_list_sha256
    _write(fake_stdlib, "pkg0/mod_0.py", b"def f_0(x):\n    return x\n")
    after = load_corpus(fake_stdlib, heldout_permille=200)
    assert after.file_list_sha256 != before
    assert after.file_list_sha256 == file_list_hash(list(reversed(after.train + after.heldout)))


def test_max_files_and_eval_subset(fake_stdlib: Path) -> None:
    c = load_corpus(fake_stdlib, heldout_permille=200, max_files=10)
    assert len(c.train) == 10 and len(c.heldout) == 2
    assert select_eval_subset(c.heldout) == select_eval_subset(list(reversed(c.heldout)))


def test_real_stdlib_split_excludes_site_packages() -> None:
    c = load_corpus(max_files=30)
    assert c.python_version and len(c.file_list_sha256) == 64
    assert not any("site-packages" in f.rel_path for f in c.train + c.heldout)
