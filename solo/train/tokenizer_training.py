"""Byte-level BPE tokenizer for the default model, trained with Hugging Face ``tokenizers``.

Byte-level BPE maps every byte to a symbol before merging, so any source file (tabs, trailing
spaces, CRLF line ends, non-ASCII identifiers) encodes and decodes byte-exactly. No normaliser is used
and the pre-tokenizer adds no prefix space, because either would alter indentation.

Documents are wrapped ``BOS text EOS`` during training. The saved ``tokenizer.json`` carries a
post-processor that prepends BOS when encoding with special tokens, so a plain prompt encodes as
``BOS + text`` exactly as a training document starts.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
#: Special tokens in id order: BOS = 0, EOS = 1, PAD = 2.
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)


def train_tokenizer(texts: Iterable[str], vocab_size: int, n_texts: int | None = None) -> Tokenizer:
    """Train a byte-level BPE tokenizer on source texts.

    BPE: Sennrich et al. 2016; byte-level alphabet and pre-tokenization as GPT-2 (Radford et al. 2019),
    through the `tokenizers` library's BpeTrainer.

    Training is deterministic for a given input order and vocabulary size.

    Args:
        texts: training documents (each a whole source file).
        vocab_size: target vocabulary size including the 3 special tokens and 256 byte symbols.
        n_texts: number of texts, only used for progress bookkeeping.

    Returns:
        The trained :class:`tokenizers.Tokenizer` with BOS/EOS/PAD at ids 0/1/2 and a
        post-processor that prepends BOS.

    Raises:
        ValueError: if ``vocab_size`` is too small to hold the byte alphabet and special tokens.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be at least {len(alphabet) + len(SPECIAL_TOKENS)}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=n_texts)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, folder: Path, model_max_length: int) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` loadable by ``AutoTokenizer``.

    Args:
        tokenizer: a tokenizer from :func:`train_tokenizer`.
        folder: destination folder (created if missing).
        model_max_length: the model's context length in tokens.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "model_max_length": model_max_length,
        # BOS comes from the tokenizer.json post-processor; EOS is never added to prompts.
        "add_bos_token": True,
        "add_eos_token": False,
        "add_prefix_space": False,
        # Default clean-up would delete spaces before punctuation and corrupt code on decode.
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    # Last, and whole or not at all: a run resumed after an interrupt takes the folder once tokenizer.json is there.
    tmp = folder / "tokenizer.json.tmp"
    tokenizer.save(str(tmp))
    os.replace(tmp, folder / "tokenizer.json")


def load_tokenizer(folder: Path) -> Tokenizer:
    """Load ``tokenizer.json`` from a folder.

    Args:
        folder: a folder written by :func:`save_tokenizer`.

    Returns:
        The :class:`tokenizers.Tokenizer`.

    Raises:
        FileNotFoundError: if ``tokenizer.json`` is missing.
    """
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer not found: {path}")
    return Tokenizer.from_file(str(path))


def tokenizer_sha256(tokenizer: Tokenizer) -> str:
    """Hash a tokenizer's full serialised form (vocab, merges, pipeline).

    Args:
        tokenizer: any tokenizer.

    Returns:
        Hex SHA-256 of ``tokenizer.to_str()``.
    """
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()


def encode_document(tokenizer: Tokenizer, text: str) -> list[int]:
    """Encode one document the way training sees it: ``[BOS] + tokens(text) + [EOS]``.

    Args:
        tokenizer: a tokenizer from :func:`train_tokenizer`.
        text: one whole source file.

    Returns:
        Token ids (list of int), length ``len(tokens(text)) + 2``.
    """
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return [tokenizer.token_to_id(BOS_TOKEN), *ids, tokenizer.token_to_id(EOS_TOKEN)]


def encode_documents(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Encode many documents as ``[BOS] + tokens + [EOS]`` using the tokenizer's thread pool.

    Args:
        tokenizer: a tokenizer from :func:`train_tokenizer`.
        texts: whole source files.

    Returns:
        One list of token ids per text, in order.
    """
    bos, eos = tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)
    encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
    return [[bos, *e.ids, eos] for e in encoded]
