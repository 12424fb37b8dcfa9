"""`python -m pflash_lab.bench ...`: the `pflash bench` commands without the installed entry point."""

from __future__ import annotations

import argparse
import sys

from pflash_lab.bench.suite import add_arguments, run_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pflash")
    add_arguments(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    args.argv = ["bench", *(sys.argv[1:] if argv is None else argv)]
    return run_bench(args)


if __name__ == "__main__":
    sys.exit(main())
