"""The lab's `pflash` subcommands other than `pflash bench` (that one is the module
`pflash_lab.bench.suite`): training what ships in pflash/data.

pyproject.toml registers each under the `pflash.commands` entry points; the product CLI
(`pflash.cli`) loads them from there and never imports the lab. An entry is anything with
`add_arguments(subparsers)`, which adds one subcommand named as the entry, and
`run(args) -> int`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    add_arguments: Callable[[argparse._SubParsersAction], None]
    run: Callable[[argparse.Namespace], int]


def _add_probe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="segment probe: train it for a drafter")
    actions = p.add_subparsers(dest="probe_command", required=True)
    train = actions.add_parser(
        "train",
        help="train the segment probe on the drafter's tap (stdlib sources, licenses) and "
        "write its GGUF",
    )
    from pflash_lab.train.probe import add_arguments

    add_arguments(train)


def _run_probe(args: argparse.Namespace) -> int:
    from pflash_lab.train.probe import run_train

    return run_train(args)


def _add_head(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("head", help="trained scoring head: train it for a drafter")
    actions = p.add_subparsers(dest="head_command", required=True)
    train = actions.add_parser(
        "train",
        help="train the scoring head (q/k projections of the scoring layer) on retrieval "
        "prompts over real text and write its GGUF",
    )
    from pflash_lab.train.head import add_arguments

    add_arguments(train)


def _run_head(args: argparse.Namespace) -> int:
    from pflash_lab.train.head import run_train

    return run_train(args)


def _add_projection(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("projection", help="tap projection (passage evidence): train it")
    actions = p.add_subparsers(dest="projection_command", required=True)
    train = actions.add_parser(
        "train",
        help="train the tap projection on question/evidence pairs over real text and write "
        "its GGUF",
    )
    from pflash_lab.train.projection import add_arguments

    add_arguments(train)


def _run_projection(args: argparse.Namespace) -> int:
    from pflash_lab.train.projection import run_train

    return run_train(args)


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure the drafter's scoring layer and per-head weights on needle prompts and "
        "write a calibration file (drafter_calibration)",
    )
    from pflash_lab.train.calibrate import add_arguments

    add_arguments(p)


def _run_calibrate(args: argparse.Namespace) -> int:
    from pflash_lab.train.calibrate import run_calibrate

    return run_calibrate(args)


probe = Command(_add_probe, _run_probe)
head = Command(_add_head, _run_head)
projection = Command(_add_projection, _run_projection)
calibrate = Command(_add_calibrate, _run_calibrate)
