"""The stop-string matcher against a brute-force statement of its rules, on random streams."""

from __future__ import annotations

import random

import pytest

from solo.engine.sampling import MAX_STOP_CHARS, SamplingParams
from solo.engine.stopping import StopStringMatcher
from solo.errors import InvalidRequestError


class _BruteForce:
    # The rules stated directly: every stop string searched in the whole held-back buffer at every feed.
    def __init__(self, stop: list[str], include: bool) -> None:
        self.stop, self.include, self.pending, self.stopped, self.matched, self.unarmed = stop, include, "", False, \
            None, 0

    def feed(self, text: str, armed: bool) -> str:
        buffer = self.pending + text
        if armed:
            starts = [i for s in self.stop for i in [buffer.find(s, max(0, self.unarmed - len(s) + 1))] if i >= 0]
            if starts:
                first = min(starts)
                self.pending, self.stopped = "", True
                self.matched = min((s for s in self.stop if buffer.startswith(s, first)
                                    and first + len(s) > self.unarmed), key=len)
                return buffer[:first + len(self.matched)] if self.include else buffer[:first]
        hold = max((k for s in self.stop for k in range(min(len(s) - 1, len(buffer)), 0, -1)
                    if buffer.endswith(s[:k])), default=0)
        self.pending = buffer[len(buffer) - hold:] if hold else ""
        released = len(buffer) - hold
        self.unarmed = len(self.pending) if not armed else max(0, self.unarmed - released)
        return buffer[:released]


def test_the_matcher_follows_the_rules_on_random_streams():
    rng = random.Random(0)
    for case in range(3000):
        alphabet = "ab\n" if case % 2 else "abc"
        stop = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4))]
        include = rng.random() < 0.3
        fast, slow = StopStringMatcher(stop, include), _BruteForce(stop, include)
        out_fast = out_slow = ""
        for _ in range(rng.randint(1, 8)):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4)))
            armed = rng.random() < 0.7
            out_fast += fast.feed(text, armed)
            out_slow += slow.feed(text, armed)
            assert (out_fast, fast.pending, fast.stopped) == (out_slow, slow.pending, slow.stopped), (stop, case)
            if fast.stopped:
                assert fast.matched == slow.matched
                break


def test_many_stop_strings_cost_no_more_per_character():
    # A request with 50,000 stop strings made every other request 25-180x slower: the scheduler scanned them
    # all at each token. Now a character costs one trie step per held-back suffix, plus one from the root.
    class Counted(dict):
        steps = 0

        def get(self, key, default=None):
            Counted.steps += 1
            return super().get(key, default)

    matcher = StopStringMatcher([f"zq{i}xw" for i in range(50_000)])
    matcher._next = Counted(matcher._next)
    assert matcher.feed("hello world " * 20) == "hello world " * 20
    assert Counted.steps == len("hello world " * 20)  # (no character starts a stop string here)
    assert matcher.feed("zq123") == "" and matcher.pending == "zq123"
    assert matcher.feed("xw!") == "" and matcher.matched == "zq123xw"
    assert Counted.steps < 240 + 5 * 6


def test_stop_strings_past_the_bound_are_refused_by_name():
    SamplingParams(stop=["x" * 1000] * (MAX_STOP_CHARS // 1000))
    with pytest.raises(InvalidRequestError, match=f"stop holds {MAX_STOP_CHARS + 1} characters in all; at most"):
        SamplingParams(stop=["x" * MAX_STOP_CHARS, "y"])

