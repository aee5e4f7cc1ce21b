"""Stop strings: matched across token boundaries, left out of the output, held-back text released.

Text that could still turn into a stop string (a suffix of the output that is a prefix of some stop
string) is held back; once it cannot, it is released. On a match everything from the match on is dropped
(or, with `include`, everything after the matched stop string: vLLM's `include_stop_str_in_output`).
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

    def feed(self, text: str) -> str:
        """Add generated text; return what is safe to emit now. Sets `stopped` when a stop string matched."""
        if not self.stop:
            return text
        buffer = self.pending + text
        first = min((i for i in (buffer.find(s) for s in self.stop) if i >= 0), default=-1)
        if first >= 0:
            self.pending = ""
            self.stopped = True
            if self.include:  # the shortest stop string at that place is the one that completed first
                return buffer[:first + min(len(s) for s in self.stop if buffer.startswith(s, first))]
            return buffer[:first]
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(buffer)), 0, -1):
                if buffer.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        self.pending = buffer[len(buffer) - hold:] if hold else ""
        return buffer[: len(buffer) - hold]

    def flush(self) -> str:
        """Release held-back text when generation ends for another reason (EOS, length)."""
        text, self.pending = self.pending, ""
        return text
