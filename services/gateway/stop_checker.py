"""Stop strings matched across token boundaries.

Text arrives in pieces; a stop string may start in one piece and end in a later one. The
checker holds back the longest tail of the text that could still begin a stop string, so a
stop string is never shown to the client, and releases that tail once it cannot match (or at
the end of generation).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StopChecker:
    stop: tuple[str, ...]
    pending: str = ""  # text held back: a prefix of some stop string
    matched: str | None = field(default=None)  # the stop string that ended the text
    include_stop: bool = False  # vLLM's include_stop_str_in_output: show the stop string too

    def add(self, text: str, search: bool = True) -> str:
        """Feed new text; return what may be shown now. After a match, `matched` is set and
        the returned text ends right before the stop string. Without `search` (vLLM's
        `min_tokens` not reached yet) the text passes unsearched."""
        if self.matched is not None:
            return ""
        buffer = self.pending + text
        if not self.stop or not search:
            self.pending = ""
            return buffer
        hit = self._earliest_match(buffer)
        if hit is not None:
            index, stop = hit
            self.matched = stop
            self.pending = ""
            return buffer[: index + len(stop)] if self.include_stop else buffer[:index]
        keep = self._longest_partial_tail(buffer)
        self.pending = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """At the end of generation: the held-back text was not a stop string after all."""
        rest, self.pending = self.pending, ""
        return "" if self.matched is not None else rest

    def _earliest_match(self, buffer: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self.stop:
            index = buffer.find(stop)
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _longest_partial_tail(self, buffer: str) -> int:
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest
