"""Training options from parsed command-line arguments."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TypeVar

T = TypeVar("T")


def options_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """`cls` (a dataclass of training options) with every field the arguments name taken
    from them, lists as tuples; a field with no argument keeps its default. Why: each
    trainer's flags are its options' fields, so spelling them out again per trainer only
    lets the two drift apart."""
    values = {}
    for f in dataclasses.fields(cls):
        if hasattr(args, f.name):
            value = getattr(args, f.name)
            values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)
