"""Tokenizer loading: tokenizer.json, SentencePiece-only folders, special tokens."""

from __future__ import annotations

import shutil

import pytest

from solo.tokenizer import Tokenizer

TEXT = "Hello world!\n  def f(x):\n\treturn x  # ünïcödé 你好 🙂"


@pytest.mark.parametrize("name", ["Llama-2-7b-hf", "Mistral-7B-Instruct-v0.3", "Phi-3-mini-4k-instruct",
                                  "Mixtral-8x7B-Instruct-v0.1"])
def test_encode_matches_transformers(shared_hf, name):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(shared_hf / name))
    ours = Tokenizer.from_folder(shared_hf / name)
    assert ours.encode(TEXT) == hf(TEXT)["input_ids"]
    ids = ours.encode(TEXT)
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_sentencepiece_only_folder_is_converted(shared_hf, tmp_path):
    src = shared_hf / "Llama-2-7b-hf"
    for name in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / name, tmp_path / name)
    converted = Tokenizer.from_folder(tmp_path)
    reference = Tokenizer.from_folder(src)
    plain = "Hello world, this is a test of the converter."
    assert converted.encode(plain) == reference.encode(plain)
    assert converted.special_tokens["bos_token"] == "<s>"
    assert converted.decode(converted.encode(TEXT)) == reference.decode(reference.encode(TEXT))


def test_special_tokens_from_config(tiny_llama):
    tok = Tokenizer.from_folder(tiny_llama)
    assert tok.special_tokens["eos_token"] == "</s>"
    assert tok.token_id("eos_token") == 2
    assert tok.decode(tok.encode("hi") + [2]) == "hi"
