"""A reasoning model's thoughts told apart from its answer, in each chat format."""

from __future__ import annotations

from app.store.reasoning import answer_of, parts, split, thinking_after


def _cut(text: str, thinking: bool = False, begins: bool = True) -> list[tuple[str, str]]:
    return [(p.kind, text[p.start : p.end]) for p in parts(text, thinking, begins)]


def test_think_tags_mark_the_reasoning_and_are_markup() -> None:
    text = "<think>\nIt is 2 + 2.\n</think>\n\nFour."
    assert _cut(text) == [
        ("markup", "<think>"),
        ("reasoning", "\nIt is 2 + 2.\n"),
        ("markup", "</think>"),
        ("answer", "\n\nFour."),
    ]


def test_a_closing_tag_alone_means_the_prompt_opened_the_reasoning() -> None:
    # Newer Qwen templates end the prompt with "<think>\n".
    assert _cut("It is 2 + 2.\n</think>\n\nFour.") == [
        ("reasoning", "It is 2 + 2.\n"),
        ("markup", "</think>"),
        ("answer", "\n\nFour."),
    ]


def test_gpt_oss_harmony_channels() -> None:
    text = (
        "<|channel|>analysis<|message|>User wants 4.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Four."
    )
    assert _cut(text) == [
        ("markup", "<|channel|>analysis<|message|>"),
        ("reasoning", "User wants 4."),
        ("markup", "<|end|>"),
        ("markup", "<|start|>assistant"),
        ("markup", "<|channel|>final<|message|>"),
        ("answer", "Four."),
    ]


def test_a_part_that_goes_on_inside_reasoning() -> None:
    assert _cut("more thoughts", thinking=True) == [("reasoning", "more thoughts")]
    assert thinking_after("<think>\nfirst", False)
    assert not thinking_after("done</think>\n", True)
    assert _cut("No reasoning here.") == [("answer", "No reasoning here.")]


def test_an_answer_that_shows_the_tags_keeps_them_as_text() -> None:
    text = "Models write:\n```\n<think>\nplan\n</think>\n```\nor `</think>` inline."
    assert _cut(text) == [("answer", text)]
    # Nor does a later part of a reply open reasoning with a "<think>" of its own.
    assert _cut("<think>\nnot a reply's start\n\n", begins=False) == [
        ("answer", "<think>\nnot a reply's start\n\n")
    ]


def test_a_replys_answer_leaves_out_its_thoughts_and_markup() -> None:
    assert answer_of("<think>\nPlan.\n</think>\n\nFour.") == "Four."
    assert answer_of("Plan.\n</think>\n\nFour.") == "Four."  # the prompt opened it
    harmony = (
        "<|channel|>analysis<|message|>Add.<|end|><|start|>assistant<|channel|>final<|message|>4"
    )
    assert answer_of(harmony) == "4"
    assert answer_of("<think>\nHalf a thought") == "Half a thought"  # stopped before answering
    assert answer_of("  Plain *text*\n") == "  Plain *text*\n"  # no reasoning: as written


def test_a_replys_thoughts_and_answer_without_markup() -> None:
    assert split("<think>\n Plan.\n</think>\n\nFour. ") == ("Plan.", "Four.")
    assert split("No thoughts here.") == ("", "No thoughts here.")
