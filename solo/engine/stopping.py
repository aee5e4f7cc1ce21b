"""Stop strings: matched across token boundaries, left out of the output, held-back text released.

Text that could still turn into a stop string (a suffix of the output that is a prefix of some stop
string) is held back; once it cannot, it is released. On a match everything from the match on is dropped
(or, with `include`, everything after the matched stop string: vLLM's `include_stop_str_in_output`).
Text fed unarmed (before vLLM's `min_tokens` are generated) cannot end the output: only a stop string that
ends in armed text counts, though it may begin in the unarmed text before it.
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
        if armed:
            # A stop string at i counts when it ends after the unarmed text: i + len(s) > self._unarmed.
            found = (buffer.find(s, max(0, self._unarmed - len(s) + 1)) for s in self.stop)
            first = min((i for i in found if i >= 0), default=-1)
            if first >= 0:
                self.pending = ""
                self.stopped = True
                # The shortest stop string at that place is the one that completed first.
                self.matched = min((s for s in self.stop if buffer.startswith(s, first)
                                    and first + len(s) > self._unarmed), key=len)
                if self.include:
                    return buffer[:first + len(self.matched)]
                return buffer[:first]
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(buffer)), 0, -1):
                if buffer.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        self.pending = buffer[len(buffer) - hold:] if hold else ""
        released = len(buffer) - hold
        self._unarmed = len(self.pending) if not armed else max(0, self._unarmed - released)
        return buffer[:released]

    def flush(self) -> str:
        """Release held-back text when generation ends for another reason (EOS, length)."""
        text, self.pending, self._unarmed = self.pending, "", 0
        return text
