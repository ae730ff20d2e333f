"""Tandem's command line: the app by default, plus headless commands."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from app import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem", description="Private local chat with speculative decoding."
    )
    parser.add_argument("--version", action="version", version=f"tandem {__version__}")
    parser.add_argument("--model", help="target model folder to load at start")
    parser.add_argument("--draft", help="draft model folder to load at start")
    parser.add_argument("--data-dir", type=Path, help="folder for conversations and settings")
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="run one chat turn headless and stream the reply")
    gen.add_argument("prompt", help="the user message")
    gen.add_argument("--model", required=True, dest="gen_model", help="target model folder")
    gen.add_argument("--draft", dest="gen_draft", help="draft model folder")
    gen.add_argument("--num-draft", type=int, default=4, help="draft tokens per round (k)")
    gen.add_argument("--temp", type=float, default=0.0, help="temperature; 0 is greedy")
    gen.add_argument("--seed", type=int, help="sampling seed")
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--system", help="system prompt")
    gen.add_argument("--json", action="store_true", help="print one JSON object at the end")
    return parser


def _generate(args: argparse.Namespace) -> int:
    from app.engine import IncompatiblePairError, ModelError, load_pair
    from app.engine.generate import stream_reply
    from app.engine.types import Chunk, GenerationParams, Message

    if args.num_draft < 0 or args.max_tokens < 1 or args.temp < 0:
        print("tandem: --num-draft, --max-tokens and --temp must be positive", file=sys.stderr)
        return 2
    try:
        pair = load_pair(args.gen_model, args.gen_draft)
    except IncompatiblePairError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 2
    except ModelError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 1
    messages = [Message("user", args.prompt)]
    if args.system:
        messages.insert(0, Message("system", args.system))
    params = GenerationParams(
        max_tokens=args.max_tokens,
        temperature=args.temp,
        seed=args.seed,
        num_draft=args.num_draft,
    )
    cancel = threading.Event()
    text: list[str] = []
    events = stream_reply(pair, messages, params, cancel)
    finished = None
    try:
        for event in events:
            if isinstance(event, Chunk):
                text.append(event.text)
                if not args.json:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
            else:
                finished = event
    except KeyboardInterrupt:
        cancel.set()
        finished = next(e for e in events if not isinstance(e, Chunk))
    assert finished is not None
    if args.json:
        out = {
            "text": "".join(text),
            "token_ids": list(finished.token_ids),
            "origins": "".join(o.code for o in finished.origins),
            "finish_reason": finished.finish_reason,
            "target": str(pair.target.path),
            "draft": str(pair.draft.path) if pair.draft else None,
            **finished.stats.as_dict(),
        }
        print(json.dumps(out, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        s = finished.stats
        acc = "-" if s.acceptance is None else f"{s.acceptance:.0%}"
        print(
            f"[{s.tokens} tokens, {s.generation_tps:.1f} tok/s, acceptance {acc}, "
            f"{finished.finish_reason}]",
            file=sys.stderr,
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``tandem`` and ``python -m app``."""
    args = _parser().parse_args(argv)
    if args.command == "generate":
        return _generate(args)
    if (
        sys.platform.startswith("linux")
        and not os.environ.get("QT_QPA_PLATFORM")
        and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    ):
        print(
            "tandem: no display to open a window on; run it under Xvfb (xvfb-run tandem) "
            "or use `tandem generate` headless",
            file=sys.stderr,
        )
        return 2
    from app.ui.application import run_app

    return run_app([sys.argv[0]], data_dir=args.data_dir, target=args.model, draft=args.draft)
