"""`pflash` command line: plan, compress, trace view, and the commands the lab registers
(`bench`, `probe train`, `head train`, `projection train`, `calibrate`).

Each subcommand lives in the module of what it does; this file only parses arguments. The
product does not import the lab (pflash_lab): a package adds commands through the
`pflash.commands` entry-point group, each entry an object (a module will do) with
`add_arguments(subparsers)` (adding one subcommand named as the entry) and
`run(args) -> int`. Where the lab is not installed, its commands say how to get it.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points

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


@dataclass(frozen=True)
class _Missing:
    """A registered command whose package cannot be imported here: `pflash NAME` says what
    to install instead of failing on an import error, and exits 2."""

    name: str
    error: str

    def message(self) -> str:
        return (
            f"pflash {self.name}: this command belongs to the lab (pflash_lab: benchmark "
            "harness, trainers, corpora), which the pflash-serve distribution does not install "
            f"({self.error}). It runs from a checkout of the repository: `bash scripts/setup.sh` "
            "there installs PFlash with its test and bench extras and puts the lab on the path."
        )

    def add_arguments(self, sub: argparse._SubParsersAction) -> None:
        p = sub.add_parser(
            self.name, help="(lab command, not installed)", add_help=False, prefix_chars="\0"
        )
        p.add_argument("rest", nargs="*")

    def run(self, args: argparse.Namespace) -> int:
        print(self.message(), file=sys.stderr)
        return 2


def _registered_commands() -> dict[str, object]:
    """Commands registered under the entry-point group `pflash.commands` (the lab's:
    `bench`, `probe`, `head`, `projection`, `calibrate`); one whose package is not
    importable becomes a `_Missing` that says so."""
    commands: dict[str, object] = {}
    for ep in entry_points(group=COMMANDS_GROUP):
        try:
            commands[ep.name] = ep.load()
        except ImportError as exc:
            commands[ep.name] = _Missing(ep.name, str(exc))
    return commands


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pflash", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_plan(sub)
    _add_compress(sub)
    _add_trace(sub)
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
    if args.command in registered:
        return registered[args.command].run(args)
    if args.command == "trace":
        from pflash.cli.trace_view import run_trace_view

        return run_trace_view(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
