"""`pflash` command line: plan, compress, trace view, probe/head/projection train, calibrate, and the
commands other packages register (the benchmark harness registers `pflash bench`).

Each subcommand lives in the module of what it does; this file only parses arguments. The
product does not import the benchmark harness: a package adds commands through the
`pflash.commands` entry-point group, each entry a module with `add_arguments(subparsers)`
(adding one subcommand named as the entry) and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from types import ModuleType

COMMANDS_GROUP = "pflash.commands"


def _add_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="print turns, query windows and pinned spans of a prompt")
    p.add_argument("file", help='messages JSON ({"messages": [...]}) or a plain text file')
    p.add_argument(
        "--target-tokenizer",
        default=None,
        help="target tokenizer source (default: the embedded model)",
    )
    p.add_argument(
        "--drafter", default=None, help="drafter tokenizer source (default: the embedded model)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--query", default=None, help="explicit pflash_query")
    p.add_argument(
        "--required", action="append", default=None, help="a pflash_required string (repeatable)"
    )


def _add_compress(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compress", help="compress a prompt with the drafter (mode always) and print it with stats"
    )
    p.add_argument("file", help='messages JSON ({"messages": [...]}) or a plain text file')
    p.add_argument(
        "--keep-ratio", type=float, default=None, help="keep ratio r0 in (0, 1] (default: config)"
    )
    p.add_argument(
        "--drafter",
        default=None,
        help="drafter model and tokenizer source (default: config, the embedded model)",
    )
    p.add_argument(
        "--target-tokenizer",
        default=None,
        help="target tokenizer source (default: config, the embedded model)",
    )
    p.add_argument("--config", default=None, help="YAML file of PFlashConfig keys")
    p.add_argument(
        "--chunk-size", type=int, default=None, help="select_chunk_size in drafter tokens"
    )
    p.add_argument("--json", action="store_true", help='print one {"prompt", "stats"} object')


def _add_probe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="segment probe: train it for a drafter")
    actions = p.add_subparsers(dest="probe_command", required=True)
    train = actions.add_parser(
        "train",
        help="train the segment probe on the drafter's tap (stdlib sources, licenses) and "
        "write its GGUF",
    )
    from pflash.train.probe import add_arguments

    add_arguments(train)


def _add_head(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("head", help="trained scoring head: train it for a drafter")
    actions = p.add_subparsers(dest="head_command", required=True)
    train = actions.add_parser(
        "train",
        help="train the scoring head (q/k projections of the scoring layer) on retrieval "
        "prompts over real text and write its GGUF",
    )
    from pflash.train.head import add_arguments

    add_arguments(train)


def _add_projection(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("projection", help="tap projection (passage evidence): train it")
    actions = p.add_subparsers(dest="projection_command", required=True)
    train = actions.add_parser(
        "train",
        help="train the tap projection on question/evidence pairs over real text and write "
        "its GGUF",
    )
    from pflash.train.projection import add_arguments

    add_arguments(train)


def _registered_commands() -> dict[str, ModuleType]:
    """Commands installed packages register (entry points of group `pflash.commands`)."""
    return {ep.name: ep.load() for ep in entry_points(group=COMMANDS_GROUP)}


def _add_trace(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="inspect JSONL traces")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    view = tsub.add_parser(
        "view", help="one self-contained HTML page per traced request (kept/dropped, scores)"
    )
    view.add_argument("trace", help="a selection (trace_path) or view trace JSONL")
    view.add_argument(
        "-o", "--output", required=True, help="page.html (several records: page-N.html)"
    )
    view.add_argument("--record", type=int, default=None, help="only record N (1-based)")
    view.add_argument(
        "--tokenizer", default=None, help="drafter tokenizer source (default: the embedded model)"
    )


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure the drafter's scoring layer and per-head weights on needle prompts and "
        "write a calibration file (drafter_calibration)",
    )
    from pflash.train.calibrate import add_arguments

    add_arguments(p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pflash", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_plan(sub)
    _add_compress(sub)
    _add_probe(sub)
    _add_head(sub)
    _add_projection(sub)
    _add_trace(sub)
    _add_calibrate(sub)
    registered = _registered_commands()
    for command in registered.values():
        command.add_arguments(sub)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command == "plan":
        from pflash.cli.plan import run_plan

        return run_plan(args)
    if args.command == "compress":
        from pflash.cli.compress import run_compress

        return run_compress(args)
    if args.command == "probe" and args.probe_command == "train":
        from pflash.train.probe import run_train

        return run_train(args)
    if args.command == "head" and args.head_command == "train":
        from pflash.train.head import run_train as run_head_train

        return run_head_train(args)
    if args.command == "projection" and args.projection_command == "train":
        from pflash.train.projection import run_train as run_projection_train

        return run_projection_train(args)
    if args.command in registered:
        return registered[args.command].run(args)
    if args.command == "trace":
        from pflash.cli.trace_view import run_trace_view

        return run_trace_view(args)
    if args.command == "calibrate":
        from pflash.train.calibrate import run_calibrate

        return run_calibrate(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
