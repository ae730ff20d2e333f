from app.engine.lookup import PromptLookup


def test_proposes_what_followed_the_suffix() -> None:
    lookup = PromptLookup(max_ngram=3, min_ngram=2)
    lookup.reset([1, 2, 3, 4, 5, 9, 1, 2, 3])
    assert lookup.propose(2) == [4, 5]
    assert lookup.propose(10) == [4, 5, 9, 1, 2, 3]


def test_prefers_the_longest_then_newest_match() -> None:
    lookup = PromptLookup(max_ngram=3, min_ngram=2)
    lookup.reset([7, 2, 3, 8, 1, 2, 3, 9, 5, 1, 2, 3])
    # The trigram 1 2 3 was followed by 9; the bigram 2 3 also by 8, but is shorter.
    assert lookup.propose(1) == [9]
    lookup.extend([4, 6, 2, 3])
    # Newest occurrence of 2 3 was followed by 4.
    assert lookup.propose(1) == [4]


def test_never_matches_itself_and_needs_min_ngram() -> None:
    lookup = PromptLookup(max_ngram=3, min_ngram=2)
    lookup.reset([1, 2, 3])
    assert lookup.propose(4) == []
    lookup.reset([5, 6, 5])
    assert lookup.propose(4) == []  # a lone 5 is shorter than min_ngram
    assert lookup.propose(0) == []


def test_extend_matches_reset() -> None:
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 1, 4, 1]
    a, b = PromptLookup(), PromptLookup()
    a.reset(seq)
    b.reset(seq[:5])
    for t in seq[5:]:
        b.extend([t])
    assert a.propose(5) == b.propose(5) == [5, 9, 2, 6, 5]
