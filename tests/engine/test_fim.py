"""Fill-in-the-middle: the format found from the vocabulary (the real Qwen tokenizers' and tiny ones), the prompt
laid out as transformers tokenizes it, the middle ending at the FIM end tokens, and models without FIM refused."""

from __future__ import annotations

import json

import pytest
from checkpoints import make_checkpoint

from solo import Engine
from solo.engine.fim import FIM_FORMATS, detect_fim
from solo.errors import InvalidRequestError

QWEN_FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|endoftext|>")
PREFIX, SUFFIX = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("fim") / "model", extra_tokens=QWEN_FIM)


@pytest.fixture(scope="module")
def fim_engine(fim_model):
    return Engine.load(fim_model, backend="eager", dtype="float32")


def test_formats_found_from_real_vocabularies(shared_hf):
    # Qwen2.5's and Qwen3's vocabularies hold the FIM markers as (non-special) added tokens.
    for name in ("Qwen2.5-Instruct", "Qwen3-0.6B"):
        config = json.loads((shared_hf / name / "tokenizer_config.json").read_text())
        vocab = {t["content"]: int(i) for i, t in config["added_tokens_decoder"].items()}
        fim = detect_fim(vocab.get)
        assert fim is not None and fim.format.name == "qwen" and fim.middle_id == vocab["<|fim_middle|>"]
        assert fim.end_ids == (vocab["<|fim_pad|>"], vocab["<|file_sep|>"], vocab["<|repo_name|>"],
                               vocab["<|endoftext|>"], vocab["<|fim_prefix|>"], vocab["<|fim_suffix|>"],
                               vocab["<|fim_middle|>"])
    llama = json.loads((shared_hf / "Llama-3.2-1B" / "tokenizer_config.json").read_text())
    assert detect_fim({t["content"]: int(i) for i, t in llama["added_tokens_decoder"].items()}.get) is None
    for fmt in FIM_FORMATS:  # each format's prompt: prefix, suffix, then the middle's marker
        vocab = {fmt.prefix: 1, fmt.suffix: 2, fmt.middle: 3}
        assert detect_fim(vocab.get).format == fmt
        assert fmt.prompt("a", "b") == f"{fmt.prefix}a{fmt.suffix}b{fmt.middle}"


def test_the_prompt_is_tokenized_as_transformers_does(fim_engine, fim_model):
    from transformers import AutoTokenizer

    request = fim_engine.make_request(PREFIX, {"max_tokens": 4}, suffix=SUFFIX)
    text = f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    assert request.prompt_ids == AutoTokenizer.from_pretrained(fim_model)(text)["input_ids"]
    ids = fim_engine.tokenizer.backend.token_to_id
    assert {ids("<|fim_pad|>"), ids("<|endoftext|>")} <= request.eos_ids  # the middle's ends
    assert ids("<|fim_pad|>") not in fim_engine.make_request(PREFIX, {"max_tokens": 4}).eos_ids  # (only there)


def test_complete_fills_the_middle_and_stops_at_its_end(fim_engine, monkeypatch):
    greedy = {"max_tokens": 8, "temperature": 0}
    text = fim_engine.infill_prompt(PREFIX, SUFFIX)
    assert fim_engine.complete(PREFIX, greedy, suffix=SUFFIX).token_ids == fim_engine.complete(text, greedy).token_ids
    ids = fim_engine.tokenizer.backend.token_to_id
    for end in ("<|fim_pad|>", "<|fim_middle|>"):  # (a marker: Qwen's are plain added tokens, shown as text)
        ended = fim_engine.complete(PREFIX, {**greedy, "logit_bias": {ids(end): 100}}, suffix=SUFFIX)
        assert ended.finish_reason == "stop" and ended.token_ids == [ids(end)] and ended.text == ""
        # A FIM prompt the caller laid out (Tabby's, Twinny's templates) ends there too.
        raw = fim_engine.complete(text, {**greedy, "logit_bias": {ids(end): 100}})
        assert raw.finish_reason == "stop" and raw.token_ids == [ids(end)]
    # An empty suffix is none (as on the server): a plain completion; a suffix that is not text is refused.
    assert fim_engine.make_request(PREFIX, greedy, suffix="").prompt_ids == fim_engine.make_request(
        PREFIX, greedy).prompt_ids
    with pytest.raises(InvalidRequestError, match="suffix must be text"):
        fim_engine.make_request(PREFIX, greedy, suffix=0)
    # The caller's own stop_token_ids still name what stopped it, a FIM end among them.
    pad = ids("<|fim_pad|>")
    named = fim_engine.complete(PREFIX, {**greedy, "logit_bias": {pad: 100}, "stop_token_ids": [pad]}, suffix=SUFFIX)
    assert named.stop_reason == pad


def test_what_fim_cannot_take_is_refused(fim_engine):
    plain = Engine.load(None)  # the bundled model: no FIM tokens
    with pytest.raises(InvalidRequestError, match="has no fill-in-the-middle tokens") as info:
        plain.make_request(PREFIX, {"max_tokens": 4}, suffix=SUFFIX)
    assert info.value.param == "suffix"
    for prompt in ([{"role": "user", "content": "x"}], [1, 2, 3]):
        with pytest.raises(InvalidRequestError, match="send the prompt as text"):
            fim_engine.make_request(prompt, {"max_tokens": 4}, suffix=SUFFIX)


@pytest.mark.parametrize("fmt, prefill, opens", [
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {', True),
    ("hermes", "<tool_call>", True),
    ("hermes", '<tool_call>{"name": "f", "arguments": {}}</tool_call>\nThe time is', False),  # closed
    ("hermes", "Tools are called with <tool_call> tags; here I answer directly:", False),  # prose
    ("qwen3_coder", "<tool_call>\n<function=get_time>\n<parameter=zone>\nCE", True),
    ("qwen3_coder", "<function=get_time>\n", True),
    ("qwen3_coder", "Calls look like <function=NAME>...</function>; none needed.", False),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {', True),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}}] done', False),
    ("llama3_json", "{", False),  # a JSON prefill, the common way to ask for JSON output
    (None, "<tool_call>", False),
])
def test_which_prefills_open_a_call(fmt, prefill, opens):
    from solo.engine.tool_calls import prefill_opens_call

    assert prefill_opens_call(fmt, prefill) is opens


def test_a_prefill_that_opens_a_tool_call_is_refused():
    # The call's start would be in the prompt and its end in the reply, which parses as no call (it was content).
    engine = Engine.load(None)  # Hermes tool calls
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    ask = [{"role": "user", "content": "time?"}]
    opened = [*ask, {"role": "assistant", "content": '<tool_call>\n{"name": "get_time", "arguments": {'}]
    with pytest.raises(InvalidRequestError, match="opens a tool call it does not close"):
        engine.make_request(opened, {"max_tokens": 4}, tools=tools, continue_final_message=True)
    closed = [*ask, {"role": "assistant", "content": "Let me check."}]
    engine.make_request(closed, {"max_tokens": 4}, tools=tools, continue_final_message=True)
    engine.make_request(opened, {"max_tokens": 4}, continue_final_message=True)  # no tools: only text
    # Text parts are joined first, as the server joins them (the list skipped the check).
    parts = [*ask, {"role": "assistant", "content": [{"type": "text", "text": opened[-1]["content"]}]}]
    with pytest.raises(InvalidRequestError, match="opens a tool call"):
        engine.make_request(parts, {"max_tokens": 4}, tools=tools, continue_final_message=True)
    # A null arguments string in a history is no arguments, as a blank one.
    call = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "null"}}
    engine.make_request([*ask, {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "12:00"}], {"max_tokens": 2}, tools=tools)


def test_marker_text_in_the_code_stays_text(fim_engine):
    # Code that writes a marker (a tokenizer config being edited) broke the layout: it became a second marker.
    ids = fim_engine.tokenizer.backend.token_to_id
    prefix = "s = '<|fim_suffix|>'\n"
    prompt = fim_engine.make_request(prefix, {"max_tokens": 2}, suffix="x").prompt_ids
    assert prompt.count(ids("<|fim_suffix|>")) == 1 and prompt.count(ids("<|fim_prefix|>")) == 1
    assert fim_engine.tokenizer.decode(prompt, skip_special_tokens=False).endswith(
        "<|fim_prefix|>s = '<|fim_suffix|>'\n<|fim_suffix|>x<|fim_middle|>")


@pytest.mark.parametrize("name", ["Mistral-7B-Instruct-v0.3", "Phi-3-mini-4k-instruct", "Llama-2-7b-hf"])
def test_plain_encoding_is_the_tokenizers_without_added_tokens(shared_hf, name):
    from solo.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(shared_hf / name)
    for text in ("def add(a, b):\n    return a + b\n", "  ünïcödé 你好 🙂\n\ttab", "x", " ", "a\n\n\nb  c   d"):
        assert tokenizer.encode_plain(text) == tokenizer.encode(text, add_special_tokens=False), text
    assert tokenizer.encode_plain("") == []


def test_the_layout_is_the_whole_texts_encoding_on_metaspace_tokenizers(tmp_path):
    # Code read plain only where it holds a marker's text: encoded by pieces, a Metaspace tokenizer that
    # prepends "▁" to the first piece prepended it to the prefix and to the suffix (spaces not in the file).
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from solo.tokenizer import Tokenizer as SoloTokenizer

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.normalizer = normalizers.NFC()
    tok.train_from_iterator(["def add(a, b):\n    return a + b\n"] * 20, trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>"], show_progress=False))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_FIM])
    folder = tmp_path / "tok"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    tokenizer = SoloTokenizer.from_folder(folder)
    engine = Engine.__new__(Engine)  # (a tokenizer is all infill_ids reads)
    engine.tokenizer = tokenizer
    engine.name = "t"
    text = "<|fim_prefix|>x = 1<|fim_suffix|>\n\nprint(x)<|fim_middle|>"
    assert engine.infill_ids("x = 1", "\n\nprint(x)") == tokenizer.encode(text)
    # With a marker's text in the code, that text is plain and the layout's markers are the only markers.
    ids = engine.infill_ids("s = '<|fim_suffix|>'", "y")
    assert ids.count(tok.token_to_id("<|fim_suffix|>")) == 1


def test_infill_layout_fits_oldest_files_first_then_cuts_the_far_ends():
    from solo.engine.fim import SNIPPET_HEADER, infill_layout

    def encode(text):  # one id per character, from 1000 on
        return [1000 + ord(c) for c in text]

    markers = {"<|fim_prefix|>": 1, "<|fim_suffix|>": 2, "<|fim_middle|>": 3}
    fim = detect_fim(markers.get)
    assert fim.repo_id is None and fim.file_separator_id is None
    whole = [0, 1, *encode("ab"), 2, *encode("cd"), 3]  # BOS, then the layout
    files = [("old.py", "xxxx"), ("new.py", "yy")]
    layout = infill_layout(fim, encode, whole, "ab", "cd", files)
    snippet = encode(SNIPPET_HEADER)
    assert layout.ids == [0, *snippet, *encode("xxxx"), *snippet, *encode("yy"), *whole[1:]]
    assert not layout.truncated
    fitted = infill_layout(fim, encode, whole, "ab", "cd", files, budget=len(whole) + len(snippet) + 2)
    assert fitted.files_dropped == 1 and fitted.ids[1:1 + len(snippet) + 2] == [*snippet, *encode("yy")]
    # No room for any file, nor the whole code: the prefix keeps its end (up to 3/4 of the room), the suffix
    # its start.
    cut = infill_layout(fim, encode, whole, "ab", "cd", files, budget=len(whole) - 2)
    assert cut.ids == [0, 1, *encode("ab"), 2, 3] and cut.truncated and cut.files_dropped == 2
    assert (cut.prefix_tokens_cut, cut.suffix_tokens_cut) == (0, 2)
    long = infill_layout(fim, encode, [0, 1, *encode("abcdefgh"), 2, *encode("ijkl"), 3], "abcdefgh", "ijkl",
                         budget=12)
    assert long.ids == [0, 1, *encode("cdefgh"), 2, *encode("ij"), 3]  # (room 8: a quarter to the suffix)
    with pytest.raises(ValueError, match="cannot hold"):
        infill_layout(fim, encode, whole, "ab", "cd", budget=3)
    # With a repository marker and a file separator: the repository-level form.
    repo = detect_fim({**markers, "<|repo_name|>": 4, "<|file_sep|>": 5}.get)
    layout = infill_layout(repo, encode, whole, "ab", "cd", [("a.py", "z")])
    assert layout.ids == [0, 4, *encode("myproject\n"), 5, *encode("a.py\n"), *encode("z"), 5,
                          *encode("filename\n"), *whole[1:]]
