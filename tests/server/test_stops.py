"""StopMatcher: stop strings found across text deltas, nothing of them sent."""

from __future__ import annotations

import pytest

from app.server.stops import StopMatcher


def _run(stops: list[str], deltas: list[str]) -> tuple[list[str], bool]:
    """What the matcher lets out delta by delta, and whether it found a stop."""
    matcher = StopMatcher(stops)
    out = []
    for delta in deltas:
        text, stopped = matcher.feed(delta)
        out.append(text)
        if stopped:
            return out, True
    out.append(matcher.flush())
    return out, False


def test_a_stop_split_over_three_deltas_is_found_and_never_sent() -> None:
    out, stopped = _run(["<END>"], ["Hi <", "EN", "D> and after"])
    assert stopped
    assert out == ["Hi ", "", ""]  # "<" and "EN" were held, then dropped with the stop


def test_only_a_tail_that_could_begin_a_stop_is_held() -> None:
    matcher = StopMatcher(["abc"])
    assert matcher.feed("xxab") == ("xx", False)
    assert matcher.feed("d") == ("abd", False)  # not the stop after all: sent at once
    assert matcher.feed("a") == ("", False)
    assert matcher.flush() == "a"  # the reply ended: what was held is text


def test_the_earliest_of_several_stops_wins() -> None:
    out, stopped = _run(["world", "lo w"], ["hello", " world"])
    assert stopped and "".join(out) == "hel"


def test_a_stop_inside_one_delta_keeps_the_text_before_it() -> None:
    assert StopMatcher(["\n\n"]).feed("one\n\ntwo") == ("one", True)


def test_a_held_tail_that_overlaps_itself_is_still_caught() -> None:
    out, stopped = _run(["aab"], ["a", "a", "a", "b", "c"])
    assert stopped and "".join(out) == "a"


@pytest.mark.parametrize("deltas", [["plain text"], ["pla", "in ", "text"]])
def test_without_stops_text_passes_untouched(deltas: list[str]) -> None:
    out, stopped = _run([], deltas)
    assert not stopped and out[:-1] == deltas and out[-1] == ""
