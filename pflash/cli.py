"""`pflash` command line: plan, compress, bench, trace view, probe train.

Each subcommand lives in the module of what it does; this file only parses arguments.
"""

from __future__ import annotations

import argparse
import sys


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pflash", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_plan(sub)
    _add_compress(sub)
    args = parser.parse_args(argv)
    if args.command == "plan":
        from pflash.plan_cli import run_plan

        return run_plan(args)
    if args.command == "compress":
        from pflash.compress_cli import run_compress

        return run_compress(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
