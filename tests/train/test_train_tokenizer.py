import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from solo.train.corpus import load_corpus
from solo.train.tokenizer_training import (
    BOS_TOKEN,
    EOS_TOKEN,
    encode_document,
    save_tokenizer,
    tokenizer_sha256,
    train_tokenizer,
)

TRICKY = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "class Stack:\n\tdef push(self, x):  \n\t\tself.items.append(x)\n\n\n\n",
    "s = 'caf\u00e9 \u65e5\u672c \u00fc'  # non-ASCII \U0001f600\r\nx = 1\r\n",
    "   leading spaces ; x , y . z ( ) [ ] { } ! ?\n\x0c\nif x :pass\n",
    "",
    " ",
    "\n",
]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [f.text for f in load_corpus(max_files=15).train]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, texts: list[str]) -> Path:
    out = tmp_path_factory.mktemp("tok")
    save_tokenizer(train_tokenizer(texts, 400), out, model_max_length=128)
    return out


def test_training_is_deterministic(texts: list[str]) -> None:
    a, b = train_tokenizer(texts, 400), train_tokenizer(texts, 400)
    assert a.get_vocab_size() == 400
    assert tokenizer_sha256(a) == tokenizer_sha256(b)
    assert a.token_to_id(BOS_TOKEN) == 0 and a.token_to_id(EOS_TOKEN) == 1


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip_with_transformers(folder: Path, text: str) -> None:
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.eos_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids[1:]) == text


def test_prompt_encoding_matches_training_documents(folder: Path, texts: list[str]) -> None:
    from solo.train.tokenizer_training import load_tokenizer

    raw = load_tokenizer(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    doc = encode_document(raw, texts[0])
    assert doc[0] == tok.bos_token_id and doc[-1] == tok.eos_token_id
    # A prompt that is a prefix of a training document encodes as that document's prefix.
    prompt = texts[0][:200]
    assert tok(prompt)["input_ids"] == raw.encode(prompt).ids
    assert raw.encode(prompt).ids[0] == doc[0]
    assert raw.decode(doc[1:-1]) == texts[0]


def test_config_files(folder: Path) -> None:
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert cfg["bos_token"] == BOS_TOKEN and cfg["eos_token"] == EOS_TOKEN
    assert cfg["model_max_length"] == 128 and cfg["clean_up_tokenization_spaces"] is False
    tok = json.loads((folder / "tokenizer.json").read_text())
    assert tok["post_processor"]["type"] == "TemplateProcessing"
    assert tok["decoder"]["type"] == "ByteLevel"
