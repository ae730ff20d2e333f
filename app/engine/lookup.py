"""Prompt-lookup drafting: propose what followed the last n-gram earlier on.

Chat replies often quote the prompt or the conversation (code being edited,
names, earlier answers). Matching the newest n tokens against the whole history
finds such spans for free, without a draft model.
"""

from __future__ import annotations

from collections.abc import Sequence


class PromptLookup:
    """An incremental n-gram index over a token sequence.

    Args:
        max_ngram: Longest suffix tried first.
        min_ngram: Shortest suffix that may still propose.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tokens: list[int] = []
        # n-gram -> end position (exclusive) of its newest occurrence
        self._index: dict[tuple[int, ...], int] = {}

    def reset(self, tokens: Sequence[int] = ()) -> None:
        self.tokens = []
        self._index.clear()
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Appends tokens, indexing the n-grams that end before the newest token."""
        for t in tokens:
            # Index n-grams ending at the current end before appending, so the
            # suffix being matched never matches itself.
            end = len(self.tokens)
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end >= n:
                    self._index[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(t)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest matching suffix before."""
        if k <= 0:
            return []
        seq = self.tokens
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(seq) < n:
                continue
            end = self._index.get(tuple(seq[-n:]))
            if end is not None and end < len(seq):
                return seq[end : end + k]
        return []
