"""Stop strings: matched across token boundaries, left out of the output, held-back text released.

Text that could still turn into a stop string (a suffix of the output that is a prefix of some stop
string) is held back; once it cannot, it is released. On a match everything from the match on is dropped
(or, with `include`, everything after the matched stop string: vLLM's `include_stop_str_in_output`).
Text fed unarmed (before vLLM's `min_tokens` are generated) cannot end the output: only a stop string that
ends in armed text counts, though it may begin in the unarmed text before it.

The stop strings are a trie, and the matcher follows every suffix of the text that is still a prefix of one
of them (the text it holds back), so each new character costs one step per such suffix, whatever the number
of stop strings: a request with thousands of them no longer slows the scheduler every other request shares.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Filters streamed text for stop strings.

    Args:
        stop: the stop strings (non-empty).
        include: keep the matched stop string at the end of the output.
    """

    def __init__(self, stop: Sequence[str], include: bool = False) -> None:
        self.stop = [s for s in stop if s]
        self.include = include
        self.pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the output
        self._unarmed = 0  # the first characters of `pending` that were fed unarmed
        # The trie: node 0 is the root; _next[(node, char)] -> node; a node's depth is its prefix's length;
        # _ends[node]: the stop string ending there; _inner: nodes some stop string goes past (proper prefixes).
        self._next: dict[tuple[int, str], int] = {}
        self._depth = [0]
        self._ends: dict[int, str] = {}
        self._inner: set[int] = set()
        for s in self.stop:
            node = 0
            for c in s:
                self._inner.add(node)
                child = self._next.get((node, c))
                if child is None:
                    child = self._next[(node, c)] = len(self._depth)
                    self._depth.append(self._depth[node] + 1)
                node = child
            self._ends[node] = s
        self._live: list[int] = []  # the held-back suffixes' nodes (each ends at the end of `pending`)

    def feed(self, text: str, armed: bool = True) -> str:
        """Add generated text; return what is safe to emit now. Sets `stopped` when a stop string matched.

        Args:
            text: the new text.
            armed: False while stop strings may not end the output yet (min_tokens): a match must end
                after this text.
        """
        if not self.stop:
            return text
        buffer = self.pending + text
        live, step = self._live, self._next
        first, matched = -1, None  # the match that starts first in the buffer (the shortest one there)
        for end, c in enumerate(text, len(self.pending) + 1):
            advanced = []
            for node in (*live, 0):
                child = step.get((node, c))
                if child is None:
                    continue
                if armed and child in self._ends:
                    start = end - self._depth[child]
                    if first < 0 or start < first or (start == first and self._depth[child] < len(matched)):
                        first, matched = start, self._ends[child]
                if child in self._inner:
                    advanced.append(child)
            live = advanced
        if matched is not None:
            self.pending, self._live = "", []
            self.stopped, self.matched = True, matched
            return buffer[:first + len(matched)] if self.include else buffer[:first]
        self._live = live
        hold = self._depth[live[0]] if live else 0  # (the longest suffix comes first: it started earliest)
        self.pending = buffer[len(buffer) - hold:] if hold else ""
        released = len(buffer) - hold
        self._unarmed = len(self.pending) if not armed else max(0, self._unarmed - released)
        return buffer[:released]

    def flush(self) -> str:
        """Release held-back text when generation ends for another reason (EOS, length)."""
        text, self.pending, self._unarmed, self._live = self.pending, "", 0, []
        return text
