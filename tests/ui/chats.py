"""Conversations the UI tests share, made in a store."""

from __future__ import annotations

from app.store import Store


def branched(store: Store) -> tuple[int, int]:
    """A long chat whose third question was edited; the edit's reply says "zebra".

    Returns:
        The chat, and the reply on branch 2 that matches "zebra"; branch 1 is shown.
    """
    long = "More words. " * 40
    cid = store.create_conversation("Animals").id
    for i in range(2):
        store.add_message(cid, "user", f"Question {i}")
        store.add_message(cid, "assistant", f"Answer {i}\n\n{long}")
    edited = store.add_message(cid, "user", "Question 2")
    store.add_message(cid, "assistant", "A horse.")
    store.add_message(cid, "user", "Edited question 2", parent_id=edited.parent_id)
    hit = store.add_message(cid, "assistant", "A zebra, striped.")
    for i in range(3, 8):  # branch 2 goes on long after the hit
        store.add_message(cid, "user", f"Question {i}")
        store.add_message(cid, "assistant", f"Answer {i}\n\n{long}")
    store.switch_branch(edited.id)  # branch 1 on screen
    assert hit.id not in {m.id for m in store.messages(cid)}
    return cid, hit.id
