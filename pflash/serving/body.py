"""Reading a request body as JSON, with the limits a public endpoint needs.

Python's `json` accepts things no OpenAI client sends and that break later stages: NaN and
Infinity literals, integers of any length (a 5,000-digit literal raises deep inside the
parser; an integer past 64 bits fails only when the target seeds its sampler), nesting deep
enough to exhaust the stack, and `\\ud800` escapes that decode to lone UTF-16 surrogates
(valid JSON, invalid Unicode: the tokenizer or the response encoder fails on them). Each is
a 400 here, naming where it is, before any field is validated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pflash.errors import InvalidRequest

MAX_JSON_DEPTH = 64  # tool parameter schemas nest a few levels; nothing legitimate nears 64
MAX_INT_DIGITS = 24  # 64-bit integers have at most 20 digits


def _int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise InvalidRequest(
            f"request body has an integer of {len(literal)} digits (at most {MAX_INT_DIGITS})",
            code="invalid_json",
        )
    return int(literal)


def _constant(name: str) -> Any:
    raise InvalidRequest(
        f"request body is not valid JSON: {name} is not a number", code="invalid_json"
    )


def load_json_body(body: bytes | str) -> Any:
    """The body as JSON, or `InvalidRequest` (400, code invalid_json / invalid_unicode)."""
    try:
        value = json.loads(body, parse_int=_int, parse_constant=_constant)
    except RecursionError:
        raise InvalidRequest(
            f"request body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(
            f"request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    check_json_tree(value)
    return value


def check_json_tree(value: Any) -> None:
    """Depth at most `MAX_JSON_DEPTH` and every string (keys too) valid Unicode; the error
    names the path of the first offender (`messages[0].content`). Iterative: a tree at the
    recursion limit must not crash the check meant to reject it."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            raise InvalidRequest(
                f"request body nests deeper than {MAX_JSON_DEPTH} levels",
                param=_path(path[:4]) + "…",
                code="invalid_json",
            )
        if isinstance(node, str):
            _check_text(node, path)
        elif isinstance(node, dict):
            for key, item in node.items():
                _check_text(key, path, field_name=True)
                stack.append((item, (*path, key)))
        elif isinstance(node, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(node))


def _check_text(text: str, path: tuple[Any, ...], *, field_name: bool = False) -> None:
    """`text` at `path` encodes as UTF-8; a field name is reported at its object's path."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        where = _path(path) or "the request body"
        what = f"a field name in {where}" if field_name else where
        raise InvalidRequest(
            f"{what} is not valid Unicode (a lone UTF-16 surrogate)",
            param=_path(path) or None,
            code="invalid_unicode",
        ) from None


def _path(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if isinstance(part, str) and part.isascii() else "?"
            out += f".{name[:40]}" if out else name[:40]
    return out


def json_object(body: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    """A request body as the JSON object every endpoint takes: raw bytes or text parsed with
    the limits above, a mapping checked the same way; a 400 when it is not an object."""
    if isinstance(body, bytes | str):
        body = load_json_body(body)
    else:
        check_json_tree(body)
    if not isinstance(body, Mapping):
        raise InvalidRequest("request body must be a JSON object", code="invalid_type")
    return dict(body)
