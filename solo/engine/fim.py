"""Fill-in-the-middle (FIM): a code model writes what goes between a prefix and a suffix.

Copilots complete code inside a file, not only at its end: they send the text before the cursor and the text
after it, and the model, trained with FIM (Bavarian et al. 2022, "Efficient Training of Language Models to
Fill in the Middle"), writes the middle. The prompt is the prefix-suffix-middle layout of its FIM tokens:
`PRE prefix SUF suffix MID`, and the model writes the middle, then one of its end tokens.

The format is found from the vocabulary, as llama.cpp finds its FIM tokens: the first of `FIM_FORMATS` whose
three markers are all tokens of the model. OpenAI's completions `suffix`, Ollama's generate `suffix` and
`Engine.complete(prefix, suffix=...)` use it.

Editors also send code from other files (llama-server's `/infill` `input_extra`). Where the vocabulary has a
repository marker and a file separator (Qwen2.5-Coder's `<|repo_name|>` and `<|file_sep|>`, StarCoder2's), the
files go before the layout in the repository-level form the model was trained on (Qwen2.5-Coder technical
report, Hui et al. 2024, section 3): `REPO name`, then per file `FILE_SEP path`, a newline and its text, then
`FILE_SEP` and the current file's name; without those markers each file's text follows a plain-text snippet
header. `infill_layout` builds those ids and fits them in a token budget, much as llama-server lays out and fits
its `/infill` prompt: whole files from the oldest first (llama-server cuts their tokens from the front), then the
prefix's start and the suffix's end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FimFormat:
    """A model family's FIM tokens.

    Attributes:
        name: the family's name.
        prefix, suffix, middle: the markers written before the prefix, the suffix and the middle.
        ends: tokens that end a middle besides the model's EOS (padding and file separators the model may
            write after it), where the vocabulary has them.
    """

    name: str
    prefix: str
    suffix: str
    middle: str
    ends: tuple[str, ...] = ()

    def prompt(self, prefix: str, suffix: str) -> str:
        """The prompt text whose continuation is the middle (prefix-suffix-middle order)."""
        return f"{self.prefix}{prefix}{self.suffix}{suffix}{self.middle}"


FIM_FORMATS = (
    # Qwen2.5-Coder, Qwen3-Coder, CodeGemma
    FimFormat("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
              ("<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|endoftext|>", "<|file_separator|>")),
    # StarCoder, StarCoder2, SantaCoder, Granite Code
    FimFormat("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
              ("<fim_pad>", "<file_sep>", "<|endoftext|>")),
    # DeepSeek-Coder
    FimFormat("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", ("<|EOT|>", "<｜end▁of▁sentence｜>")),
)


# Repository-level markers, where a vocabulary has them (Qwen2.5-Coder's; StarCoder2's; StarCoder's).
_REPO_MARKERS = ("<|repo_name|>", "<repo_name>", "<reponame>")
_FILE_SEPARATORS = ("<|file_sep|>", "<file_sep>")
# llama-server's names where the request has none: the repository's and the current file's.
REPO_NAME, CURRENT_FILE = "myproject", "filename"
SNIPPET_HEADER = "\n\n--- snippet ---\n\n"
"""What goes before another file's text where the vocabulary has no file separator."""


@dataclass(frozen=True)
class Fim:
    """A model's FIM format, the ids of its end tokens and of its middle marker (see `detect_fim`).

    `end_ids` also holds the three markers: a middle never contains one, and a model writing one starts
    another FIM layout (where the vocabulary keeps them as plain added tokens, as Qwen's does, they would
    show in the text). `repo_id` and `file_separator_id` are the repository-level markers, or None.
    """

    format: FimFormat
    end_ids: tuple[int, ...]
    middle_id: int
    prefix_id: int = -1
    suffix_id: int = -1
    repo_id: int | None = None
    file_separator_id: int | None = None


@dataclass(frozen=True)
class InfillLayout:
    """The token ids of a fill-in-the-middle prompt fitted in a budget (see `infill_layout`).

    Attributes:
        ids: the prompt's token ids.
        files_dropped: how many of the other files (the oldest first) were left out to fit.
        prefix_tokens_cut: tokens cut from the start of the prefix to fit.
        suffix_tokens_cut: tokens cut from the end of the suffix to fit.
    """

    ids: list[int]
    files_dropped: int = 0
    prefix_tokens_cut: int = 0
    suffix_tokens_cut: int = 0

    @property
    def truncated(self) -> bool:
        """Whether anything the request gave was left out to fit."""
        return bool(self.files_dropped or self.prefix_tokens_cut or self.suffix_tokens_cut)


def infill_layout(fim: Fim, encode: Callable[[str], list[int]], whole: list[int], prefix: str, suffix: str,
                  files: Sequence[tuple[str, str]] = (), budget: int | None = None) -> InfillLayout:
    """The ids of `[files] PRE prefix SUF suffix MID`, fitted in `budget` tokens.

    Other files go first (repository-level form, or snippet headers: see the module docstring). To fit the
    budget, whole files are left out from the first (the oldest in an editor's list), then the prefix loses tokens
    from its start and the suffix from its end, the suffix keeping up to a quarter of the room (more where the
    prefix needs less), as llama-server shares its batch.

    Args:
        fim: the model's FIM format.
        encode: text -> its ids as plain text (no BOS, added tokens' texts read as text).
        whole: the ids of the prompt without files, as the tokenizer encodes the whole layout (its BOS
            included); used as they are when nothing is cut.
        prefix, suffix: the code before and after the gap.
        files: (path, text) of other files, oldest first.
        budget: the most tokens the prompt may take; None: no limit.

    Returns:
        The layout, saying what was left out.

    Raises:
        ValueError: the budget cannot hold even the markers (and the tokenizer's BOS).
    """
    first = whole.index(fim.prefix_id)
    last = len(whole) - 1 - whole[::-1].index(fim.middle_id)
    head, core, tail = whole[:first], whole[first:last + 1], whole[last + 1:]
    chunks = [_file_ids(fim, encode, path, text) for path, text in files]
    opening = ([fim.repo_id, *encode(REPO_NAME + "\n")] if fim.repo_id is not None and fim.file_separator_id is not None
               else [])
    current = [fim.file_separator_id, *encode(CURRENT_FILE + "\n")] if opening else []

    def assemble(kept: list[list[int]], core: list[int]) -> list[int]:
        extra = [*opening, *(i for chunk in kept for i in chunk), *current] if kept else []
        return [*head, *extra, *core, *tail]

    limit = budget if budget is not None else float("inf")
    bare = len(head) + len(core) + len(tail)
    size, dropped = bare + len(opening) + len(current) + sum(map(len, chunks)), 0
    while dropped < len(chunks) and size > limit:  # (the oldest files out first)
        size -= len(chunks[dropped])
        dropped += 1
    if dropped < len(chunks) or bare <= limit:
        return InfillLayout(assemble(chunks[dropped:], core), files_dropped=dropped)
    prefix_ids, suffix_ids = encode(prefix), encode(suffix)
    room = int(limit) - len(head) - len(tail) - 3  # (the three markers)
    if room < 0:
        raise ValueError(f"the budget of {budget} tokens cannot hold the layout's markers "
                         f"({len(head) + len(tail) + 3} tokens)")
    keep_suffix = min(len(suffix_ids), max(room // 4, room - len(prefix_ids)))
    keep_prefix = min(len(prefix_ids), room - keep_suffix)
    core = [fim.prefix_id, *prefix_ids[len(prefix_ids) - keep_prefix:], fim.suffix_id, *suffix_ids[:keep_suffix],
            fim.middle_id]
    return InfillLayout(assemble([], core), files_dropped=len(chunks), prefix_tokens_cut=len(prefix_ids) - keep_prefix,
                        suffix_tokens_cut=len(suffix_ids) - keep_suffix)


def _file_ids(fim: Fim, encode: Callable[[str], list[int]], path: str, text: str) -> list[int]:
    # One other file: FILE_SEP path \n text, or a snippet header and the text.
    if fim.repo_id is not None and fim.file_separator_id is not None:
        return [fim.file_separator_id, *encode(path + "\n"), *encode(text)]
    return [*encode(SNIPPET_HEADER), *encode(text)]


def detect_fim(token_id: Callable[[str], int | None]) -> Fim | None:
    """The model's FIM format, or None when its vocabulary has no complete set of FIM markers.

    Args:
        token_id: a token's text -> its id, or None when the vocabulary lacks it (added tokens included).
    """
    for fmt in FIM_FORMATS:
        markers = [token_id(marker) for marker in (fmt.prefix, fmt.suffix, fmt.middle)]
        if all(i is not None for i in markers):
            ends = tuple(dict.fromkeys(i for i in [*map(token_id, fmt.ends), *markers] if i is not None))
            repo = next((i for i in map(token_id, _REPO_MARKERS) if i is not None), None)
            separator = next((i for i in map(token_id, _FILE_SEPARATORS) if i is not None), None)
            return Fim(fmt, ends, markers[2], markers[0], markers[1], repo, separator)  # type: ignore[arg-type]
    return None
