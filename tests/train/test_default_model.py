"""Checks on the shipped default model folder (skipped until it has been trained)."""

import hashlib
import json
from pathlib import Path

import pytest
from safetensors import safe_open

from solo.errors import ModelNotFoundError
from solo.model import default_model
from solo.model.default_model import DEFAULT_MODEL_NAME, default_model_path
from solo.train.corpus import SourceFile
from solo.train.evaluate import xz_bits_per_byte
from solo.train.pipeline import evaluate_folder


@pytest.fixture(scope="module")
def shipped() -> Path:
    try:
        return default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(f"shipped model folder not present (train it with scripts/train_default_model.sh): {exc}")


@pytest.fixture(scope="module")
def summary(shipped: Path) -> dict:
    return json.loads((shipped / "training_summary.json").read_text())


def test_missing_folder_raises_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "assets_dir", lambda: tmp_path)
    with pytest.raises(ModelNotFoundError, match=DEFAULT_MODEL_NAME):
        default_model_path()


def test_folder_layout_size_and_dtype(shipped: Path, summary: dict) -> None:
    assert shipped.name == DEFAULT_MODEL_NAME == summary["model_name"]
    total = sum(p.stat().st_size for p in shipped.rglob("*") if p.is_file())
    assert total < 50 * 2**20
    config = json.loads((shipped / "config.json").read_text())
    with safe_open(shipped / "model.safetensors", "pt") as f:
        dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118
        assert "lm_head.weight" not in f.keys()  # tied to the input embedding
    assert dtypes == {"BF16"} and config["dtype"] == config["torch_dtype"] == "bfloat16"
    assert config["num_key_value_heads"] < config["num_attention_heads"] and config["tie_word_embeddings"]
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert (shipped / name).is_file()


def _subset_files(shipped: Path) -> list[SourceFile]:
    data = json.loads((shipped / "eval_subset.json").read_text())
    files = []
    for entry in data["files"]:
        raw = entry["text"].encode("utf-8")
        assert hashlib.sha256(raw).hexdigest() == entry["sha256"], entry["path"]
        files.append(SourceFile(entry["path"], entry["text"], entry["sha256"], len(raw)))
    return files


def test_subset_loss_reproduces(shipped: Path, summary: dict) -> None:
    recorded = summary["eval_subset"]
    files = _subset_files(shipped)
    assert [f.rel_path for f in files] == [f["path"] for f in recorded["files"]]
    result = evaluate_folder(shipped, files, stride=recorded["stride"], device="cpu", amp_dtype=None)
    assert result["n_tokens"] == recorded["n_tokens"] and result["n_bytes"] == recorded["n_bytes"]
    assert result["loss"] == pytest.approx(recorded["loss"], rel=0.01)
    assert result["bits_per_byte"] == pytest.approx(recorded["bits_per_byte"], rel=0.01)


def test_beats_xz(shipped: Path, summary: dict) -> None:
    held, xz = summary["heldout"], summary["xz_heldout"]
    assert held["n_bytes"] == xz["n_bytes"]
    assert held["bits_per_byte"] < xz["concatenated_bits_per_byte"]
    assert held["bits_per_byte"] < xz["per_file_bits_per_byte"]
    assert summary["beats_xz"] is True
    recorded = summary["eval_subset"]
    xz_subset = xz_bits_per_byte([f.text for f in _subset_files(shipped)])
    assert xz_subset == recorded["xz"]
    assert recorded["bits_per_byte"] < xz_subset["per_file_bits_per_byte"]


def test_card_mentions_what_the_issue_requires(shipped: Path, summary: dict) -> None:
    card = (shipped / "README.md").read_text()
    for needle in (
        "PSF",
        summary["corpus"]["python_version"],
        summary["corpus"]["file_list_sha256"],
        f"{summary['parameters']:,}",
        "bits per byte",
        "xz -9e",
        "def fibonacci(n):",
        "chat",
    ):
        assert needle in card, needle


def test_tokenizer_encodes_prompts_like_training(shipped: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shipped)
    prompt = "def fibonacci(n):\n    "
    ids = tok(prompt)["input_ids"]
    assert ids[0] == tok.bos_token_id == 0 and ids.count(tok.bos_token_id) == 1
    assert tok.decode(ids, skip_special_tokens=True) == prompt
