"""Random greedy exactness sweep: Tandem's replies against mlx-lm's plain decoding.

Tiny random models of each family (``tests/engine/families.py``); each case draws the
prompt, k (0-16 or Auto), prompt lookup and reply length at random. ``window`` runs the
window's path (``stream_reply``, one to three turns on one kept decoder); ``batch`` runs
one to five requests at once on one decoder. Prints each differing case with what it
needs to be replayed, then a total per family.

    PYTHONPATH=. python3 tools/exactness_sweep.py {window,batch} SEED SECONDS [FAMILY,...]

Two logits equal to float32 rounding can rank differently in a verification and a
one-row step (docs/architecture.md, Numerics): each differing case says how far apart the
target's top two logits are where it leaves plain decoding.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

from app.engine import Finished, GenerationParams, Message, load_pair
from app.engine.decoder import Decoder, take_turns
from app.engine.generate import encode_chat, new_decoder, stream_reply
from app.engine.loader import ModelPair
from app.engine.types import DraftSetting
from app.testing.tiny import build_model, model_config
from tests.engine.families import FAMILIES, HYBRIDS, hybrid_pair, plain_greedy, window_pair

WORDS = ("the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "far", "away", "home")
KS = [0, 1, 2, 3, 4, 7, 8, 15, 16, None]


def _pairs(root: Path, family: str, tokenizer: Path) -> list[ModelPair]:
    if family in FAMILIES:
        return [load_pair(*window_pair(root / family, family, tokenizer))]
    target, copy, other = hybrid_pair(root / family, family, tokenizer)
    return [load_pair(target, copy), load_pair(target, other)]


def _differs(pair: ModelPair, prompt: list[int], got: list[int], want: list[int]) -> str | None:
    """Where ``got`` leaves plain decoding's ``want`` and by how much the target's top two
    logits differ there (0.0: a float32 tie, not a bug); ``None`` where it does not."""
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if at is None:  # plain decoding stops at its end token, the batch does not
        return None if got[: len(want)] == want else f"ends at {len(got)}, plain at {len(want)}"
    logits = pair.target.model(mx.array(prompt + want[: at + 1])[None])[0, len(prompt) + at - 1]
    top = mx.sort(logits)[-2:]
    gap = (top[1] - top[0]).item()
    return f"token {at}: {got[at]} for {want[at]}, top two logits {gap:.2e} apart"


def _params(rng: random.Random, max_tokens: int) -> GenerationParams:
    return GenerationParams(
        temperature=0,
        max_tokens=max_tokens,
        drafting=DraftSetting.of(rng.choice(KS)),
        prompt_lookup=rng.random() < 0.3,
    )


def _window_case(rng: random.Random, pair: ModelPair) -> list[str]:
    decoder, messages, found = new_decoder(pair), [], []
    for turn in range(rng.randint(1, 3)):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.choice([1, 3, 10, 30, 60])))
        messages.append(Message("user", text))
        params = _params(rng, rng.choice([8, 24, 48]))
        prompt = encode_chat(pair.target.tokenizer, messages)
        want = plain_greedy(pair, prompt, params.max_tokens)
        *_, last = stream_reply(pair, messages, params, decoder=decoder)
        assert isinstance(last, Finished), last
        if where := _differs(pair, prompt, list(last.token_ids), want):
            drafting = f"{params.drafting} lookup {params.prompt_lookup}"
            found.append(f"turn {turn} {drafting} {text!r}: {where}")
        messages.append(Message("assistant", pair.target.tokenizer.decode(list(last.token_ids))))
    return found


def _batch_case(rng: random.Random, pair: ModelPair) -> list[str]:
    assert pair.draft is not None
    decoder = Decoder(pair.target.model, pair.draft.model)
    prompts = [
        [rng.randrange(20, 300) for _ in range(rng.choice([1, 5, 17, 40, 70]))]
        for _ in range(rng.randint(1, 5))
    ]
    if rng.random() < 0.4:  # repeats, for lookup to propose
        prompts = [p * 2 for p in prompts]
    params = [_params(rng, 200) for _ in prompts]
    n = rng.choice([8, 30, 50])
    gens = [decoder.generate(p, q) for p, q in zip(prompts, params, strict=True)]
    replies = take_turns(gens, n).replies
    return [
        f"{q.drafting} lookup {q.prompt_lookup} prompt {p} beside {len(prompts) - 1}: {where}"
        for p, q, got in zip(prompts, params, replies, strict=True)
        if (where := _differs(pair, p, got, plain_greedy(pair, p, n)))
    ]


def main() -> None:
    mode, seed, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    families = sys.argv[4].split(",") if len(sys.argv) > 4 else [*HYBRIDS, *FAMILIES]
    case = {"window": _window_case, "batch": _batch_case}[mode]
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp())
    tokenizer = build_model(root / "tiny-llama", model_config("llama"), seed=0)
    start = time.perf_counter()
    for i, family in enumerate(families):
        pairs, cases, differing = _pairs(root, family, tokenizer), 0, 0
        while time.perf_counter() - start < seconds * (i + 1) / len(families):
            for line in case(rng, rng.choice(pairs)):
                differing += 1
                print(f"DIFFERS {family}: {line}", flush=True)
            cases += 1
        print(f"{family}: {cases} cases, {differing} replies differ", flush=True)


if __name__ == "__main__":
    main()
