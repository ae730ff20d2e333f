from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.engine.types import Origin, Role, Stats
from app.store import Conversation, SearchHit, Store


def test_round_trip(tmp_path: Path) -> None:
    db = tmp_path / "t.sqlite3"
    store = Store(db)
    c = store.create_conversation("Sea haiku")
    store.add_message(c.id, "user", "Write a haiku")
    stats = Stats(prompt_tokens=9, tokens=3, drafted=4, accepted=2, ttft_seconds=0.1)
    store.add_message(
        c.id,
        "assistant",
        "Waves fold",
        target="/m/t",
        draft="/m/d",
        finish_reason="stop",
        stats=stats,
        origins=(Origin.DRAFT, Origin.DRAFT, Origin.CORRECTION),
    )
    store.close()

    again = Store(db)
    [conv] = again.conversations()
    assert conv.title == "Sea haiku"
    user, reply = again.messages(conv.id)
    assert (user.role, user.content) == ("user", "Write a haiku")
    assert reply.content == "Waves fold"
    assert (reply.target, reply.draft, reply.finish_reason) == ("/m/t", "/m/d", "stop")
    assert reply.stats == stats
    assert reply.stats is not None and reply.stats.acceptance == 0.5
    assert reply.origins == (Origin.DRAFT, Origin.DRAFT, Origin.CORRECTION)


def test_stopped_reply_is_kept(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    store.add_message(c.id, "assistant", "half a rep", finish_reason="cancelled")
    [m] = Store(tmp_path / "t.sqlite3").messages(c.id)
    assert (m.content, m.finish_reason) == ("half a rep", "cancelled")


def test_conversations_sorted_by_last_use(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    a = store.create_conversation("a")
    store.create_conversation("b")
    assert [c.title for c in store.conversations()] == ["b", "a"]
    store.add_message(a.id, "user", "hi")
    assert [c.title for c in store.conversations()] == ["a", "b"]


def test_delete_removes_messages(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    store.add_message(c.id, "user", "hi")
    store.delete_conversation(c.id)
    assert store.conversations() == []
    assert store.messages(c.id) == []
    assert store.conversation(c.id) is None


def test_database_runs_in_wal_mode(tmp_path: Path) -> None:
    Store(tmp_path / "t.sqlite3")
    mode = sqlite3.connect(tmp_path / "t.sqlite3").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_rename(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation("old")
    store.rename_conversation(c.id, "new")
    assert store.conversation(c.id) is not None
    assert store.conversations()[0].title == "new"


def test_segments_round_trip(tmp_path: Path) -> None:
    from app.engine.types import Origin

    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    segments = ((Origin.DRAFT, "Hello"), (Origin.BONUS, ","), (None, " wörld"))
    store.add_message(c.id, "assistant", "Hello, wörld", segments=segments)
    store.add_message(c.id, "user", "plain")
    reply, user = store.messages(c.id)
    assert reply.segments == segments
    assert user.segments == ()
    store.close()


def test_a_version_1_database_is_migrated_in_place(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(
        """
        CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL,
            created_at REAL NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL,
            role TEXT NOT NULL, content TEXT NOT NULL, created_at REAL NOT NULL,
            target TEXT, draft TEXT, finish_reason TEXT, stats TEXT, origins TEXT);
        INSERT INTO conversations VALUES (1, 'Old chat', 1.0, 1.0);
        INSERT INTO messages (conversation_id, role, content, created_at, origins)
            VALUES (1, 'assistant', 'kept', 1.0, 'td');
        PRAGMA user_version=1;
        """
    )
    old.close()
    store = Store(path)
    [m] = store.messages(1)
    assert (m.content, m.segments, len(m.origins)) == ("kept", (), 2)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == 3
    store.add_message(1, "assistant", "new", segments=((None, "new"),))
    assert store.messages(1)[-1].segments == ((None, "new"),)
    store.close()


def test_damaged_segments_lose_colours_not_the_message(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    m = store.add_message(c.id, "assistant", "text")
    store._db.execute("UPDATE messages SET segments = '{bad' WHERE id = ?", (m.id,))
    [back] = store.messages(c.id)
    assert back.content == "text" and back.segments == ()
    store.close()


def test_pair_totals_and_recent_prompts(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    store.add_message(c.id, "user", "first")
    for accepted, drafted, draft in ((3, 4, "d"), (5, 8, "d"), (9, 9, "other"), (1, 2, None)):
        store.add_message(
            c.id,
            "assistant",
            "r",
            target="t",
            draft=draft,
            stats=Stats(drafted=drafted, accepted=accepted),
        )
    store.add_message(c.id, "user", "second")
    store.add_message(c.id, "assistant", "no stats", target="t", draft="d")
    assert store.pair_totals("t", "d") == (8, 12)
    assert store.pair_totals("t", None) == (1, 2)
    assert store.pair_totals("x", "d") == (0, 0)
    assert store.recent_prompts() == ["first", "second"]
    assert store.recent_prompts(limit=1) == ["second"]
    m = store.messages(c.id)[1]
    assert store.message(m.id) == m and store.message(10_000) is None
    store.close()


def _v2_database(path: Path) -> None:
    """A version 2 database, as Tandem wrote it before branches and search."""
    old = sqlite3.connect(path)
    old.executescript(
        """
        CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL,
            created_at REAL NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL, created_at REAL NOT NULL, target TEXT, draft TEXT,
            finish_reason TEXT, stats TEXT, origins TEXT, segments TEXT);
        CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
        INSERT INTO conversations VALUES (1, 'Tides', 1.0, 5.0), (2, 'Empty', 2.0, 2.0),
            (3, 'Moons', 3.0, 6.0);
        INSERT INTO messages (id, conversation_id, role, content, created_at, segments) VALUES
            (1, 1, 'user', 'Why are there tides?', 1.0, NULL),
            (2, 3, 'user', 'How many moons has Mars?', 2.0, NULL),
            (3, 1, 'assistant', 'The moon pulls the oceans.', 3.0, '[["d", "The moon"]]'),
            (4, 3, 'assistant', 'Two: Phobos and Deimos.', 4.0, NULL),
            (5, 1, 'user', 'And spring tides?', 5.0, NULL);
        PRAGMA user_version=2;
        """
    )
    old.close()


def test_a_version_2_database_is_migrated_to_linear_branches(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite3"
    _v2_database(path)
    store = Store(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == 3
    tides = store.messages(1)
    assert [m.content for m in tides] == [
        "Why are there tides?",
        "The moon pulls the oceans.",
        "And spring tides?",
    ]
    # Each message follows the previous one of its own conversation.
    assert [m.parent_id for m in tides] == [None, 1, 3]
    assert tides[1].segments == ((Origin.DRAFT, "The moon"),)
    assert [m.parent_id for m in store.messages(3)] == [None, 2]
    heads = {c.id: c.head_id for c in store.conversations()}
    assert heads == {1: 5, 2: None, 3: 4}
    assert _conversation(store, 1).system_prompt is None
    # Old rows are searchable, and appending continues the old branch.
    assert [h.message_id for h in store.search("tides")] == [5, 1]
    reply = store.add_message(1, "assistant", "When sun and moon align.")
    assert reply.parent_id == 5
    store.close()
    # Opening again migrates nothing twice.
    again = Store(path)
    assert [m.id for m in again.messages(1)] == [1, 3, 5, reply.id]
    assert len(again.search("tides")) == 2
    again.close()


# Branches


def _conversation(store: Store, conversation_id: int) -> Conversation:
    conversation = store.conversation(conversation_id)
    assert conversation is not None
    return conversation


def _chat(store: Store) -> tuple[int, list[int]]:
    """A conversation of four linear messages; returns its id and theirs."""
    c = store.create_conversation("Branches")
    turns: tuple[tuple[Role, str], ...] = (
        ("user", "Name a colour"),
        ("assistant", "Blue"),
        ("user", "Another"),
        ("assistant", "Green"),
    )
    ids = [store.add_message(c.id, role, text).id for role, text in turns]
    return c.id, ids


def test_a_plain_chat_is_one_branch(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid, ids = _chat(store)
    messages = store.messages(cid)
    assert [m.id for m in messages] == ids
    assert [m.parent_id for m in messages] == [None, *ids[:-1]]
    assert _conversation(store, cid).head_id == ids[-1]
    assert store.siblings(ids[2]) == [ids[2]]


def test_editing_a_user_message_makes_a_sibling_branch(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid, [q1, a1, q2, a2] = _chat(store)
    edited = store.add_message(cid, "user", "Another, warmer", parent_id=a1)
    answer = store.add_message(cid, "assistant", "Orange")
    assert answer.parent_id == edited.id
    assert [m.content for m in store.messages(cid)] == [
        "Name a colour",
        "Blue",
        "Another, warmer",
        "Orange",
    ]
    assert store.siblings(q2) == store.siblings(edited.id) == [q2, edited.id]

    store.switch_branch(q2)
    assert [m.id for m in store.messages(cid)] == [q1, a1, q2, a2]
    store.switch_branch(edited.id)
    assert [m.id for m in store.messages(cid)] == [q1, a1, edited.id, answer.id]


def test_regenerating_a_reply_and_switching_follows_the_newest_child(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid, [q1, a1, q2, a2] = _chat(store)
    b1 = store.add_message(cid, "assistant", "Red", parent_id=q1)
    assert store.messages(cid)[-1].id == b1.id
    assert store.siblings(a1) == [a1, b1.id]
    # Back on the first reply, the head goes down to its newest leaf.
    store.switch_branch(a1)
    assert _conversation(store, cid).head_id == a2
    longer = store.add_message(cid, "user", "Yet another", parent_id=a1)
    store.switch_branch(b1.id)
    store.switch_branch(q1)  # newest child of q1 is b1
    assert _conversation(store, cid).head_id == b1.id
    store.switch_branch(a1)  # newest child of a1 is the later question
    assert _conversation(store, cid).head_id == longer.id
    assert store.siblings(q2) == [q2, longer.id]
    with pytest.raises(ValueError, match="no message"):
        store.switch_branch(10_000)


def test_a_parent_must_belong_to_the_conversation(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid, ids = _chat(store)
    other = store.create_conversation("other")
    with pytest.raises(ValueError, match="not in conversation"):
        store.add_message(other.id, "user", "hi", parent_id=ids[0])
    with pytest.raises(ValueError, match="not in conversation"):
        store.add_message(cid, "user", "hi", parent_id=10_000)
    assert store.messages(other.id) == []
    assert len(store._tree(cid)) == len(ids)  # the failed adds left nothing


def test_a_new_root_starts_a_separate_branch(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid, [q1, *_] = _chat(store)
    root = store.add_message(cid, "user", "Start over", parent_id=None)
    assert [m.id for m in store.messages(cid)] == [root.id]
    assert store.siblings(q1) == [q1, root.id]


def test_deleting_the_head_branch_moves_the_head_to_a_sibling(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid, [q1, a1, q2, a2] = _chat(store)
    edited = store.add_message(cid, "user", "Another, warmer", parent_id=a1)
    store.add_message(cid, "assistant", "Orange")
    store.switch_branch(q2)
    newest = store.add_message(cid, "user", "Another, cooler", parent_id=a1)
    store.switch_branch(edited.id)

    store.delete_message(edited.id)  # and its reply
    assert store.siblings(q2) == [q2, newest.id]
    assert [m.id for m in store.messages(cid)] == [q1, a1, newest.id]
    assert store.search("Orange") == []
    store.delete_message(10_000)  # unknown: nothing happens
    assert len(store._tree(cid)) == 5

    # With the head deep below, the head goes down the remaining sibling's branch.
    store.add_message(cid, "assistant", "Teal")
    store.delete_message(newest.id)
    assert [m.id for m in store.messages(cid)] == [q1, a1, q2, a2]


def test_deleting_an_only_child_moves_the_head_to_the_parent(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid, [q1, a1, q2, _a2] = _chat(store)
    store.delete_message(q2)
    assert [m.id for m in store.messages(cid)] == [q1, a1]
    store.delete_message(q1)
    assert store.messages(cid) == [] and store._tree(cid) == []
    assert _conversation(store, cid).head_id is None
    again = store.add_message(cid, "user", "Fresh")
    assert again.parent_id is None and store.messages(cid) == [again]


def test_deleting_off_the_head_branch_keeps_the_head(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid, [q1, a1, q2, a2] = _chat(store)
    other = store.add_message(cid, "assistant", "Red", parent_id=q1)
    store.switch_branch(a1)
    store.delete_message(other.id)
    assert [m.id for m in store.messages(cid)] == [q1, a1, q2, a2]


# System prompt and copies


def test_system_prompt(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation("Pirate")
    assert c.system_prompt is None
    store.set_system_prompt(c.id, "Talk like a pirate.")
    assert _conversation(store, c.id).system_prompt == "Talk like a pirate."
    store.set_system_prompt(c.id, "")
    assert _conversation(store, c.id).system_prompt is None
    d = store.create_conversation("Poet", system_prompt="Rhyme.")
    assert store.conversation(d.id) == d and d.system_prompt == "Rhyme."


def test_duplicate_keeps_the_tree_head_and_system_prompt(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid, [q1, a1, _q2, a2] = _chat(store)
    store.add_message(cid, "assistant", "Red", parent_id=q1, stats=Stats(tokens=1))
    store.switch_branch(a1)
    store.set_system_prompt(cid, "Be brief.")

    copy = store.duplicate_conversation(cid)
    assert copy.id != cid and copy.title == "Branches (copy)"
    assert copy.system_prompt == "Be brief."
    assert store.conversations()[0].id == copy.id
    original, copied = store.messages(cid), store.messages(copy.id)
    assert [m.content for m in copied] == [m.content for m in original]
    assert copy.head_id == copied[-1].id and copy.head_id != a2
    assert not {m.id for m in copied} & {m.id for m in original}
    # The other branch came along, stats included.
    alternatives = store.siblings(copied[1].id)
    assert len(alternatives) == 2
    red = store.message(alternatives[1])
    assert red is not None and (red.content, red.stats) == ("Red", Stats(tokens=1))
    assert red.conversation_id == copy.id and red.parent_id == copied[0].id

    named = store.duplicate_conversation(cid, title="Fork")
    assert named.title == "Fork"
    with pytest.raises(ValueError):
        store.duplicate_conversation(10_000)


# Search


def test_search_finds_words_in_any_branch_by_prefix(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid, [q1, *_] = _chat(store)
    hidden = store.add_message(cid, "assistant", "Crimson, like a ripe cherry", parent_id=q1)
    store.switch_branch(store.siblings(q1)[0])

    [hit] = store.search("cherr")
    assert hit == SearchHit(cid, hidden.id, "Branches", "Crimson, like a ripe «cherry»")
    assert [h.message_id for h in store.search("RIPE crim")] == [hidden.id]
    assert store.search("ripe banana") == []  # every word must match


def test_a_reasoning_replys_hit_shows_no_markup_and_its_tags_match_nothing(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation("Colours")
    q = store.add_message(c.id, "user", "Name the primary colours")
    qwen = "<think>\nThe user wants the primary colours.\n</think>\n\nRed, yellow and blue."
    harmony = (
        "<|channel|>analysis<|message|>A haiku, then.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Autumn moonlight"
    )
    a = store.add_message(c.id, "assistant", qwen, parent_id=q.id)
    b = store.add_message(c.id, "assistant", harmony, parent_id=a.id)
    assert [(h.message_id, h.snippet) for h in store.search("user wants")] == [
        (a.id, "The «user wants» the primary colours. Red, yellow and blue.")
    ]
    assert [(h.message_id, h.snippet) for h in store.search("haiku moon")] == [
        (b.id, "A «haiku», then. Autumn «moonlight»")
    ]
    # The tags' words are in the index, but no reader sees them.
    assert store.search("think") == store.search("channel message") == []
    # Nor do they take the place of a hit a reader sees.
    long = "I think so, " + " ".join(["though it takes many words to say why"] * 6)
    said = store.add_message(c.id, "user", long, parent_id=b.id)  # ranked after the tags
    assert [h.message_id for h in store.search("think", limit=1)] == [said.id]


def test_a_long_messages_snippet_is_the_words_around_its_matches(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    words = [f"w{i}" for i in range(40)]
    m = store.add_message(c.id, "user", " ".join([*words, "Café", "crème", *words]))
    [hit] = store.search("cafe CREME")  # diacritics and case folded, as the index folds them
    assert hit.message_id == m.id
    assert hit.snippet == "…w37 w38 w39 «Café crème» w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 w10…"


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ('"', 0),
        ("'", 0),
        ("(", 0),
        ("*", 0),
        ("NEAR(", 0),
        ("blue)", 1),
        ("(blue", 1),
        ('"blue', 1),
        ("blue*", 1),
        ("-blue", 1),
        ("^blue", 1),
        ("{content}: blue", 0),
        ("blue AND", 0),  # "and" is a word like any other, found nowhere
        ("gr OR blue", 0),
        ("GR een", 0),
        ("colour:", 1),
    ],
)
def test_search_never_raises_on_odd_input(tmp_path: Path, query: str, found: int) -> None:
    store = Store(tmp_path / "t.sqlite3")
    _chat(store)
    # FTS5 syntax in the query would raise sqlite3.OperationalError unless quoted.
    assert len(store.search(query)) == found


def test_search_treats_operators_and_punctuation_as_text(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    m = store.add_message(c.id, "user", "Is it NOT obvious? (yes) cherry-pick")
    assert [h.message_id for h in store.search("NOT obvious?")] == [m.id]
    assert [h.message_id for h in store.search("(yes)")] == [m.id]
    assert [h.message_id for h in store.search('"cherry-pick"')] == [m.id]
    assert store.search("") == store.search("   ") == []
    assert store.search("obvious", limit=0) == []


def test_search_forgets_deleted_and_edited_messages(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    cid, [_, a1, *_] = _chat(store)
    other = store.create_conversation("Other")
    store.add_message(other.id, "user", "Blue whales")
    assert len(store.search("blue")) == 2
    store.delete_message(a1)
    assert [h.conversation_id for h in store.search("blue")] == [other.id]
    store.delete_conversation(other.id)
    assert store.search("blue") == []
    # SQLite reuses the id of a deleted last row: its old words must not match the new one.
    gone = store.add_message(cid, "user", "alpaca")
    store.delete_message(gone.id)
    assert store.add_message(cid, "user", "llama").id == gone.id
    assert store.search("alpaca") == []
    # An edit of the text in place (not done by Tandem, but kept in sync).
    m = store.add_message(cid, "user", "teal")
    store._db.execute("UPDATE messages SET content = 'indigo' WHERE id = ?", (m.id,))
    assert store.search("teal") == [] and len(store.search("indigo")) == 1


def test_search_orders_by_conversation_use_then_rank(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    old = store.create_conversation("Old")
    weak = store.add_message(old.id, "user", "kiwi and many many other words about fruit")
    strong = store.add_message(old.id, "user", "kiwi kiwi kiwi")
    new = store.create_conversation("New")
    fresh = store.add_message(new.id, "user", "one kiwi")
    assert [h.message_id for h in store.search("kiwi")] == [fresh.id, strong.id, weak.id]
    store.add_message(old.id, "assistant", "noted")  # Old is now the latest used
    assert [h.message_id for h in store.search("kiwi")] == [strong.id, weak.id, fresh.id]
    assert len(store.search("kiwi", limit=2)) == 2


def test_update_message_replaces_text_and_details_in_place(tmp_path: Path) -> None:
    db = tmp_path / "t.sqlite3"
    store = Store(db)
    cid = store.create_conversation().id
    user = store.add_message(cid, "user", "Tell me a story")
    partial = store.add_message(
        cid,
        "assistant",
        "Once",
        target="/m/t",
        draft="/m/d",
        finish_reason="error",
        segments=((Origin.DRAFT, "Once"),),
    )
    stats = Stats(prompt_tokens=5, tokens=3, drafted=2, accepted=1)
    segments = ((Origin.DRAFT, "Once"), (Origin.TARGET, " upon a time"))
    updated = store.update_message(
        partial.id,
        content="Once upon a time",
        finish_reason="stop",
        stats=stats,
        origins=(Origin.DRAFT, Origin.TARGET, Origin.TARGET),
        segments=segments,
    )
    store.close()

    again = Store(db)
    assert again.message(partial.id) == updated
    [first, reply] = again.messages(cid)
    assert first.id == user.id
    assert (reply.id, reply.parent_id) == (partial.id, user.id)  # same place in its branch
    assert (reply.content, reply.finish_reason, reply.stats) == ("Once upon a time", "stop", stats)
    assert (reply.target, reply.draft) == ("/m/t", "/m/d")
    assert reply.origins == (Origin.DRAFT, Origin.TARGET, Origin.TARGET)
    assert reply.segments == segments
    assert [h.message_id for h in again.search("upon")] == [partial.id]


def test_update_message_of_no_message_raises(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    with pytest.raises(ValueError, match="no message 7"):
        store.update_message(7, content="x")


def test_branches_give_each_alternative_its_place(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite3")
    c = store.create_conversation()
    first = store.add_message(c.id, "user", "a")
    reply = store.add_message(c.id, "assistant", "b")
    again = store.add_message(c.id, "assistant", "b2", parent_id=first.id)
    edit = store.add_message(c.id, "user", "a2", parent_id=None)
    assert store.branches(c.id) == {
        first.id: (1, 2),
        edit.id: (2, 2),
        reply.id: (1, 2),
        again.id: (2, 2),
    }
    for m in (first, reply, again, edit):  # the same answer as asking one by one
        ids = store.siblings(m.id)
        assert store.branches(c.id)[m.id] == (ids.index(m.id) + 1, len(ids))
    store.close()
