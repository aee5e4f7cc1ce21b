"""Tokenizer: Hugging Face `tokenizers` from a model folder, its chat template, and streaming decode.

`tokenizer.json` is loaded directly with `tokenizers`. A folder with only a SentencePiece
`tokenizer.model` (or only `vocab.json` + `merges.txt`) is converted at load time with the converter
that `transformers` ships (AutoTokenizer builds the fast tokenizer), then used the same way.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from solo.chat_template import ChatTemplate
from solo.errors import CheckpointError, InvalidRequestError, SoloWarning
from solo.model.json_file import read_json_object

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

BYTE_FALLBACK_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
"""A SentencePiece byte-fallback token's vocabulary string ("<0xE2>"); group 1 is the byte in hex."""


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json stores special tokens as strings or as serialized AddedToken dicts.
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    return read_json_object(path)


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template.

    Args:
        backend: the `tokenizers.Tokenizer`.
        special_tokens: named special tokens as strings ("bos_token", "eos_token", ...).
        chat_template: the template source, or None for a completion-only model.
    """

    def __init__(
        self, backend: HFTokenizer, special_tokens: Mapping[str, str], chat_template: str | None = None
    ) -> None:
        self.backend = backend
        self.special_tokens = dict(special_tokens)
        self._special_ids: dict[str, int] | None = None
        self._added_texts: list[str] | None = None
        self.chat_template: ChatTemplate | None = None
        self.chat_template_error: str | None = None
        """Why the model's own template is not used (it does not compile), or None."""
        if chat_template:
            try:
                self.chat_template = ChatTemplate(chat_template, self.special_tokens)
            except InvalidRequestError as exc:
                # Not fatal: a plain prompt needs no template, and --chat-template may replace it (Engine.load
                # warns where none does).
                self.chat_template_error = str(exc)

    @classmethod
    def from_folder(cls, folder: str | Path) -> Tokenizer:
        """Load the tokenizer files of a Hugging Face model folder.

        Raises:
            CheckpointError: the folder has no tokenizer files, or they cannot be read.
        """
        folder = Path(folder)
        config = _read_json(folder / "tokenizer_config.json")
        special = {
            name: text
            for name, text in ((n, _token_text(config.get(n))) for n in SPECIAL_TOKEN_NAMES)
            if text is not None
        }
        for name, value in _read_json(folder / "special_tokens_map.json").items():
            text = _token_text(value)
            if name in SPECIAL_TOKEN_NAMES and text is not None:
                special.setdefault(name, text)
        backend = _load_backend(folder)
        _add_config_tokens(backend, config, folder)
        return cls(backend, special, _chat_template_source(folder, config))

    def use_chat_template(self, source: str | None = None, tool_format: str | None = None,
                          origin: str = "the chat template given") -> None:
        """Replace the model's chat template and / or its tool-call syntax (vLLM's --chat-template, --tool-call-parser).

        Args:
            source: the template text, or None to keep the model's.
            tool_format: a tool-call syntax (`solo.engine.tool_calls.TOOL_FORMATS`), or None to detect it.
            origin: what `source` is, for a compile error.

        Raises:
            CheckpointError: a tool_format without any chat template; InvalidRequestError: the template does
                not compile, or an unknown tool_format.
        """
        if source is None and self.chat_template is not None:
            origin = "the model's chat template"
            source = self.chat_template.source
        if source is None:
            if tool_format is not None:
                has = f"this model's does not compile ({self.chat_template_error})" if self.chat_template_error \
                    else "this model has none"
                raise CheckpointError(f"a tool-call parser needs a chat template, and {has}; give one with "
                                      "--chat-template")
            return
        self.chat_template = ChatTemplate(source, self.special_tokens, tool_format, origin)
        self.chat_template_error = None

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, name: str) -> int | None:
        """Id of a named special token ("bos_token", "eos_token", ...), or None."""
        text = self.special_tokens.get(name)
        return None if text is None else self.backend.token_to_id(text)

    def special_token_ids(self) -> dict[str, int]:
        """Text -> id of every special added token (e.g. "<|im_end|>").

        Decoding skips these, so a stop string equal to one can only be matched by its id.
        """
        if self._special_ids is None:
            decoder = self.backend.get_added_tokens_decoder()
            self._special_ids = {tok.content: i for i, tok in decoder.items() if tok.special}
        return self._special_ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with `add_special_tokens` the tokenizer's post-processor adds e.g. BOS.

        Goes through `encode_batch`, which releases the GIL while it works (`encode` holds it for the whole
        call, so a long prompt tokenized on one thread froze every other Python thread, a server's event
        loop included).

        Raises:
            InvalidRequestError: `text` is not valid Unicode (an unpaired surrogate, or undecodable bytes
                carried as surrogate escapes), which `tokenizers` cannot encode.
        """
        _require_valid_unicode(text)
        return self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def added_token_texts(self) -> list[str]:
        """The texts of the tokenizer's added tokens (special or not), which encoding reads as those tokens."""
        if self._added_texts is None:
            self._added_texts = [t.content for t in self.backend.get_added_tokens_decoder().values() if t.content]
        return self._added_texts

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` as plain text, nothing added (no BOS).

        An added token's text in it (a marker written in code) is not read as that token: the normalizer,
        pre-tokenizer and model of `tokenizers`' pipeline run without its added-token step. For text holding no
        added token's text, the ids are those of `encode(text, add_special_tokens=False)`. A Metaspace
        pre-tokenizer that prepends "▁" to the first piece only prepends it here too, where the text may not be
        first. Holds the GIL (unlike `encode`): for the rare text that needs it.

        Raises:
            InvalidRequestError: `text` is not valid Unicode (see `encode`).
        """
        _require_valid_unicode(text)
        if not text:
            return []
        backend = self.backend
        normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
        pieces = (backend.pre_tokenizer.pre_tokenize_str(normalized) if backend.pre_tokenizer is not None
                  else [(normalized, (0, len(normalized)))])
        return [token.id for piece, _ in pieces for token in backend.model.tokenize(piece)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decoder_types(self) -> set[str]:
        """The types of the `tokenizers` decoder ("ByteLevel", "ByteFallback", ...; a Sequence's members)."""
        decoder = self.backend.decoder
        if decoder is None:
            return set()
        try:
            spec = json.loads(decoder.__getstate__())
        except (AttributeError, TypeError, ValueError):
            return set()
        members = spec.get("decoders", []) if spec.get("type") == "Sequence" else [spec]
        return {m.get("type", "") for m in members if isinstance(m, dict)}

    def token_string(self, token_id: int) -> str:
        """The vocabulary's string for one id, as `tokenizers` stores it ("" for an id it lacks: padding).

        Byte-level BPE writes a space as "Ġ", ...: what vLLM's /tokenize returns as token_strs.
        """
        return self.backend.id_to_token(token_id) or ""

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    **kwargs: Any) -> str:
        """Render messages with the model's chat template (see `ChatTemplate.render`).

        Raises:
            InvalidRequestError: the model has no chat template, or the messages are invalid.
        """
        if self.chat_template is None and self.chat_template_error is not None:
            raise InvalidRequestError(
                f"{self.chat_template_error}, so this model cannot take messages; give it a working template "
                "(--chat-template; Engine.load(..., chat_template=...) in Python) or send a plain prompt (the "
                "completions API, Ollama's raw: true, solo run without --chat)", param="messages")
        if self.chat_template is None:
            raise InvalidRequestError(
                "this model has no chat template, so it cannot take messages; send a plain prompt "
                "(solo run --prompt / the completions API), use a chat (instruct) model, or give this one a "
                "template (--chat-template; Engine.load(..., chat_template=...) in Python)",
                param="messages",
            )
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    **kwargs: Any) -> list[int]:
        """Token ids of the rendered conversation.

        Encoded without adding special tokens, as transformers' apply_chat_template does: templates that
        need BOS write it themselves, so it is never doubled.
        """
        return self.encode(self.render_chat(messages, add_generation_prompt, **kwargs), add_special_tokens=False)


def _require_valid_unicode(text: str) -> None:
    # `tokenizers` cannot encode an unpaired surrogate (nor undecodable bytes carried as surrogate escapes).
    if not is_valid_unicode(text):
        raise InvalidRequestError(
            "the prompt is not valid Unicode text (it holds an unpaired surrogate such as \\ud800, or bytes "
            "that are not UTF-8 such as 0xff); send UTF-8 text"
        )


def _chat_template_source(folder: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        try:
            return jinja_file.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise CheckpointError(f"{jinja_file} is not UTF-8 text ({exc}); re-download it") from None
    json_file = folder / "chat_template.json"
    if json_file.is_file():
        template = _read_json(json_file).get("chat_template")
        if isinstance(template, str):
            return template
    template = config.get("chat_template")
    if isinstance(template, list):
        # Several named templates: "default" is what transformers uses when none is asked for.
        named = {t.get("name"): t.get("template") for t in template
                 if isinstance(t, Mapping) and isinstance(t.get("name"), str)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _load_backend(folder: Path) -> HFTokenizer:
    path = folder / "tokenizer.json"
    if path.is_file():
        try:
            # (from the text: a path holding non-ASCII under an ASCII locale is not a str the Rust side takes)
            return HFTokenizer.from_str(path.read_text(encoding="utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise CheckpointError(f"cannot read {path} ({exc}); re-download it") from None
    if (folder / "vocab.json").is_file() and not (folder / "merges.txt").is_file() \
            and not (folder / "tokenizer.model").is_file():  # (a BPE vocabulary is its merges too)
        raise CheckpointError(f"{folder} has vocab.json but no merges.txt (a BPE tokenizer needs both, or a "
                              "tokenizer.json); download the tokenizer files with the model")
    if (folder / "tokenizer.model").is_file() or (folder / "vocab.json").is_file():
        return _convert_with_transformers(folder)
    raise CheckpointError(
        f"{folder} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt); "
        "download the tokenizer files with the model"
    )


def _add_config_tokens(backend: HFTokenizer, config: Mapping[str, Any], folder: Path) -> None:
    # tokenizer_config.json's added_tokens_decoder ({id: AddedToken}) that tokenizer.json lacks as added tokens
    # (missing, or in its vocabulary only), added as transformers adds them when it loads the folder (a
    # tokenizer.json written by a converter may hold the base vocabulary only: "<|begin_of_text|>" was then
    # encoded as text). tokenizers gives a new token the next id, so they are added in id order where that is
    # their id; one that would land elsewhere stays out, with a warning (it is text to this tokenizer, as it
    # was before such tokens were added).
    from tokenizers import AddedToken

    decoder = config.get("added_tokens_decoder")
    if not isinstance(decoder, Mapping):
        return
    entries = []
    for key, value in decoder.items():
        if isinstance(value, Mapping) and isinstance(value.get("content"), str) and str(key).isdecimal():
            entries.append((int(key), value))
    added = {t.content for t in backend.get_added_tokens_decoder().values()}
    for token_id, value in sorted(entries, key=lambda e: e[0]):
        content = value["content"]
        if content in added:
            continue
        existing = backend.token_to_id(content)
        # In the vocabulary, it becomes an added token at the vocabulary's id (text is split on it, as
        # transformers does, whatever id the config lists); else it is new and must take the next id.
        if existing is None and token_id != backend.get_vocab_size(with_added_tokens=True):
            warnings.warn(
                f"{folder / 'tokenizer_config.json'} lists added token {content!r} as id {token_id}, which "
                "tokenizer.json neither holds nor can take next (its next id is "
                f"{backend.get_vocab_size(with_added_tokens=True)}): it is encoded as text; re-download the "
                "tokenizer files, or save them again with transformers (AutoTokenizer.from_pretrained(...)"
                ".save_pretrained(...))", SoloWarning, stacklevel=2)
            continue
        token = AddedToken(content, single_word=bool(value.get("single_word", False)),
                           lstrip=bool(value.get("lstrip", False)), rstrip=bool(value.get("rstrip", False)),
                           normalized=bool(value.get("normalized", not value.get("special", False))),
                           special=bool(value.get("special", False)))
        if token.special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])


def _convert_with_transformers(folder: Path) -> HFTokenizer:
    # Slow (SentencePiece / BPE-vocab) tokenizers become fast ones through transformers' converters.
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise CheckpointError(
            f"{folder} has no tokenizer.json; converting its tokenizer.model needs transformers and "
            "sentencepiece: pip install transformers sentencepiece protobuf"
        ) from None
    try:
        converted = AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # conversion errors come in many types
        reason = " ".join(str(exc).split())  # (transformers' messages span lines)
        raise CheckpointError(f"could not convert the tokenizer in {folder} ({reason})") from None
    backend = getattr(converted, "backend_tokenizer", None)
    if backend is None:
        raise CheckpointError(f"transformers could not build a fast tokenizer for {folder}")
    return backend


def has_tokenizer_files(folder: Path) -> bool:
    """Whether `folder` holds tokenizer files `Tokenizer.from_folder` loads.

    tokenizer.json, a SentencePiece tokenizer.model, or a BPE vocab.json with its merges.txt.
    """
    return (folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file() or (
        (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file())


def is_valid_unicode(text: str) -> bool:
    """Whether `text` encodes to UTF-8.

    False for unpaired surrogates, including the `surrogateescape` code points Python uses for undecodable
    bytes in argv or stdin (e.g. a lone 0xff byte).
    """
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
