"""Streaming text: multi-byte characters split over tokens, stop strings across token boundaries."""

from __future__ import annotations

import pytest

from solo import Engine, SamplingParams
from solo.engine.detokenizer import IncrementalDetokenizer
from solo.engine.stopping import StopStringMatcher
from solo.tokenizer import Tokenizer


def test_multibyte_character_split_over_tokens(tiny_llama):
    tok = Tokenizer.from_folder(tiny_llama)
    text = "ok 🚀 ∫ 你 done"
    ids = tok.encode(text, add_special_tokens=False)
    # The byte-level test tokenizer has no merges for these characters: each spans several tokens.
    rocket_ids = tok.encode("🚀", add_special_tokens=False)
    assert len(rocket_ids) > 1
    detok = IncrementalDetokenizer(tok, prompt_ids=[1])
    deltas = [detok.add([i]) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text
    # While the rocket's bytes are incomplete nothing is emitted for it.
    assert "" in deltas


def test_incomplete_character_at_the_end_is_flushed_not_dropped(tiny_llama):
    tok = Tokenizer.from_folder(tiny_llama)
    rocket = tok.encode("🚀", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt_ids=[])
    emitted = "".join(detok.add([i]) for i in [*tok.encode("a", add_special_tokens=False), *rocket[:-1]])
    assert emitted == "a"
    assert detok.flush() != ""  # the partial character comes out (as U+FFFD), never silently lost


def _continued(tok: Tokenizer, ids: list[int], cut: int) -> str:
    detok = IncrementalDetokenizer(tok, prompt_ids=ids[:cut])
    return "".join(detok.add([i]) for i in ids[cut:]) + detok.flush()


@pytest.mark.parametrize("tokenizer", ["byte-level", "byte-fallback"])
def test_a_token_id_prompt_that_ends_inside_a_character(request, tiny_llama, tokenizer):
    # A break test: a client continuing a generation cut inside a character sends prompt + output ids back. The
    # prompt's text then ends in U+FFFD placeholders (one per byte for SentencePiece's byte fallback) that the
    # completing token turns into one character: the deltas, sliced at the placeholders' length, lost the
    # character and (byte fallback) as many characters after it as it had bytes less one; byte fallback decodes
    # a run of byte tokens as a whole, so a context starting or ending inside a character turned the next
    # characters into U+FFFD. Now the completed character comes out, as vLLM's DecodeStream gives it.
    if tokenizer == "byte-fallback":  # (skips where the shared fixtures are absent)
        tok = Tokenizer.from_folder(request.getfixturevalue("shared_hf") / "Llama-2-7b-chat-hf")
    else:
        tok = Tokenizer.from_folder(tiny_llama)
    text = "Price: 5🦙 hello, 你好 done 🦙🦙ß"
    ids = tok.encode(text, add_special_tokens=False)
    full = tok.decode(ids)
    cut_inside = 0
    for cut in range(1, len(ids)):
        # The output's text: what follows the prompt's last whole character.
        whole = max(k for k in range(cut + 1) if full.startswith(tok.decode(ids[:k])))
        cut_inside += whole < cut
        assert _continued(tok, ids, cut) == full[len(tok.decode(ids[:whole])):], (cut, tok.decode(ids[:cut]))
    assert cut_inside >= 6
    # A prompt's broken character that no output completes stays the prompt's.
    emoji = tok.encode("🦙", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt_ids=tok.encode("a", add_special_tokens=False) + emoji[:-1])
    continued = detok.add(tok.encode(" hello", add_special_tokens=False)) + detok.flush()
    assert continued.strip() == "hello", continued


@pytest.mark.parametrize(
    "pieces, stops, expected_text, stopped",
    [
        (["Hel", "lo wo", "rld"], ["lo w"], "Hel", True),  # match spans two pieces
        (["abc", "<", "/s", ">tail"], ["</s>"], "abc", True),  # held back over three pieces
        (["abc", "<", "x"], ["</s>"], "abc<x", False),  # held-back "<" released when the match fails
        (["one", " two"], ["zzz", " tw"], "one", True),
        (["no stops here"], [], "no stops here", False),
    ],
)
def test_stop_string_matcher(pieces, stops, expected_text, stopped):
    matcher = StopStringMatcher(stops)
    out = ""
    for piece in pieces:
        out += matcher.feed(piece)
        if matcher.stopped:
            break
    if not matcher.stopped:
        out += matcher.flush()
    assert out == expected_text
    assert matcher.stopped is stopped


@pytest.mark.parametrize(
    "pieces, stops, expected_text",
    [
        (["Hel", "lo wo", "rld"], ["lo w"], "Hello w"),  # kept, and nothing after it
        (["a<", "/s>b"], ["</s>"], "a</s>"),
        (["xab", "cd"], ["abc", "ab"], "xab"),  # two at one place: the one that completed first
    ],
)
def test_stop_string_matcher_can_keep_the_stop_string(pieces, stops, expected_text):
    # vLLM's include_stop_str_in_output.
    matcher = StopStringMatcher(stops, include=True)
    out = ""
    for piece in pieces:
        out += matcher.feed(piece)
        if matcher.stopped:
            break
    assert out == expected_text and matcher.stopped


def test_stop_string_across_token_boundaries_in_generation(tiny_llama):
    engine = Engine.load(tiny_llama)
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    pieces = [e.text for e in engine.generate("def fibonacci(n):", params)]
    full = "".join(pieces)
    # A two-character stop string made of the last character of one token's text and the first of the next.
    starts = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
    candidates = [
        (starts[i + 1] - 1, pieces[i][-1] + pieces[i + 1][0])
        for i in range(len(pieces) - 1) if pieces[i] and pieces[i + 1]
    ]
    start, stop = next((s, t) for s, t in candidates if full.find(t) == s)
    result = engine.complete("def fibonacci(n):", params.copy(stop=[stop]))
    assert result.finish_reason == "stop"
    assert result.text == full[:start]
    streamed = "".join(e.text for e in engine.generate("def fibonacci(n):", params.copy(stop=[stop])))
    assert streamed == result.text
    kept = engine.complete("def fibonacci(n):", params.copy(stop=[stop], include_stop_str_in_output=True))
    assert kept.finish_reason == "stop" and kept.text == full[:start + len(stop)]
    # The last event names the stop string that ended it (vLLM's stop_reason); EOS or length name nothing.
    last = list(engine.generate("def fibonacci(n):", params.copy(stop=["\x00never", stop])))[-1]
    assert last.stop_reason == stop
    assert list(engine.generate("def fibonacci(n):", params))[-1].stop_reason is None
    # A stop string that never matches changes nothing, held-back text included.
    unmatched = engine.complete("def fibonacci(n):", params.copy(stop=[full[-1] + "\x00never"]))
    assert unmatched.text == full and unmatched.finish_reason == "length"


def test_stream_events_shape(tiny_llama):
    engine = Engine.load(tiny_llama)
    events = list(engine.generate("def f(x):", SamplingParams(max_tokens=5, ignore_eos=True)))
    assert len(events) == 5
    assert all(e.finish_reason is None for e in events[:-1]) and events[-1].finish_reason == "length"
    stats = events[-1].stats
    assert stats.completion_tokens == 5 and stats.ttft_s > 0 and len(stats.token_times_s) == 5
    assert stats.decode_tokens_per_s > 0
