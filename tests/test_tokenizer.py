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


def test_added_tokens_only_in_tokenizer_config_are_added(tmp_path):
    # A tokenizer.json holding the base vocabulary only (as a converter may write it) beside a
    # tokenizer_config.json whose added_tokens_decoder lists the special tokens: transformers adds them, so a
    # chat template's markers are one token each, not text.
    import json

    from checkpoints import write_tokenizer
    from transformers import AutoTokenizer

    from solo.errors import SoloWarning

    folder = tmp_path / "tok"
    size = write_tokenizer(folder, chat_template=False)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {
        str(size): {"content": "<|turn_begin|>", "special": True, "lstrip": False, "rstrip": False,
                    "normalized": False, "single_word": False},
        str(size + 1): {"content": "<|tool_out|>", "special": False, "lstrip": False, "rstrip": False,
                        "normalized": False, "single_word": False}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    text = "<|turn_begin|>user said <|tool_out|> here"
    solo = Tokenizer.from_folder(folder)
    expected = AutoTokenizer.from_pretrained(str(folder)).encode(text, add_special_tokens=False)
    assert solo.encode(text, add_special_tokens=False) == expected
    assert solo.encode(text, add_special_tokens=False)[0] == size and solo.vocab_size == size + 2
    # One the vocabulary holds at its id (as converters write <|im_start|>) becomes an added token there: text
    # is split on it. (It was skipped, so the marker was spelled out.)
    tokenizer_json = json.loads((folder / "tokenizer.json").read_text())
    marker = next(t for t in tokenizer_json["added_tokens"] if t["content"] == "<|im_start|>")
    tokenizer_json["added_tokens"].remove(marker)  # (still in model.vocab, at its id)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    config["added_tokens_decoder"] = {str(marker["id"]): {"content": "<|im_start|>", "special": True,
                                                          "normalized": False}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    text = "x<|im_start|>user hi"
    expected = AutoTokenizer.from_pretrained(str(folder)).encode(text, add_special_tokens=False)
    assert Tokenizer.from_folder(folder).encode(text, add_special_tokens=False) == expected
    assert marker["id"] in expected
    # Listed at another id than the vocabulary's: still an added token, at the vocabulary's id (transformers').
    config["added_tokens_decoder"] = {str(marker["id"] + 1000): {"content": "<|im_start|>", "special": True}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    expected = AutoTokenizer.from_pretrained(str(folder)).encode(text, add_special_tokens=False)
    assert Tokenizer.from_folder(folder).encode(text, add_special_tokens=False) == expected
    assert marker["id"] in expected
    # One that cannot take its id (a gap) stays text, with a warning naming it, never a token at another id.
    config["added_tokens_decoder"] = {str(size + 5): {"content": "<|far|>", "special": True}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.warns(SoloWarning, match=r"'<\|far\|>' as id"):
        assert Tokenizer.from_folder(folder).vocab_size == size
