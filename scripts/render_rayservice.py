"""Write k8s/rayservice.yaml's serveConfigV2 from serve_config.yaml + k8s/overlay.yaml.

Why: the laptop default and the cluster run the same application. This script keeps
serve_config.yaml as the one source of truth for it. k8s/overlay.yaml holds only what the
cluster changes. The rest of the manifest is written by hand, and only the serveConfigV2
block is replaced (as text, so the manifest's comments survive).

    python scripts/render_rayservice.py           # rewrite k8s/rayservice.yaml
    python scripts/render_rayservice.py --check   # exit 1 (with a diff) if it has drifted

Merge rules: JSON merge patch (RFC 7386): mappings merge, `null` deletes a key
(a named list item `{name: X, delete: true}` drops X), and
anything else replaces. The one difference: `applications` and `deployments` lists are
matched by `name`, and a name the base does not have is an error.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
NAMED_LISTS = ("applications", "deployments")
BLOCK_KEY = re.compile(r"^(?P<indent>[ ]*)serveConfigV2:[ ]*\|[ ]*$")


def merge_config(base: Any, patch: Any, where: str = "") -> Any:
    """`base` with `patch` applied (neither is modified); see the module docstring."""
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for key, value in patch.items():
        path = f"{where}.{key}" if where else key
        if value is None:
            out.pop(key, None)
        elif key in NAMED_LISTS and isinstance(value, list):
            out[key] = _merge_named(base.get(key) or [], value, path)
        else:
            out[key] = merge_config(base.get(key), value, path)
    return out


def _merge_named(base: list[dict], patch: list[dict], where: str) -> list[dict]:
    """Items of `base` in their order, each merged with the `patch` item of the same name."""
    by_name = {item["name"]: item for item in patch}
    known = [item["name"] for item in base]
    unknown = [name for name in by_name if name not in known]
    if unknown:
        raise ValueError(
            f"{where}: {', '.join(map(repr, unknown))} not in serve_config.yaml (known: {known})"
        )
    out = []
    for item in base:
        patch_item = by_name.get(item["name"])
        if patch_item is None:
            out.append(copy.deepcopy(item))
        elif patch_item.get("delete") is True:  # `{name: X, delete: true}` drops X
            continue
        else:
            out.append(merge_config(item, patch_item, f"{where}[{item['name']}]"))
    return out


def render_serve_config(base: dict, overlay: dict) -> str:
    """The merged Serve config as the YAML text that goes into serveConfigV2."""
    merged = merge_config(base, overlay)
    return yaml.safe_dump(merged, sort_keys=False, default_flow_style=False, width=100)


def replace_serve_config(manifest: str, serve_yaml: str) -> str:
    """The manifest text with its `serveConfigV2: |` block replaced by `serve_yaml`.

    The block is every following line that is blank or indented deeper than the key.
    Trailing blank lines stay outside the block.
    """
    lines = manifest.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if BLOCK_KEY.match(line.rstrip("\n"))]
    if len(starts) != 1:
        raise ValueError(f"expected one `serveConfigV2: |` line, found {len(starts)}")
    start = starts[0]
    indent = len(BLOCK_KEY.match(lines[start].rstrip("\n")).group("indent"))
    end = start + 1
    while end < len(lines) and (
        not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip(" ")) > indent
    ):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    pad = " " * (indent + 2)
    block = [pad + line + "\n" if line else "\n" for line in serve_yaml.splitlines()]
    return "".join(lines[: start + 1] + block + lines[end:])


def render_manifest(base_path: Path, overlay_path: Path, manifest_path: Path) -> str:
    base = yaml.safe_load(base_path.read_text())
    overlay = yaml.safe_load(overlay_path.read_text()) or {}
    return replace_serve_config(manifest_path.read_text(), render_serve_config(base, overlay))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--overlay", type=Path, default=ROOT / "k8s" / "overlay.yaml")
    parser.add_argument("--manifest", type=Path, default=ROOT / "k8s" / "rayservice.yaml")
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if the manifest differs"
    )
    args = parser.parse_args(argv)
    current = args.manifest.read_text()
    rendered = render_manifest(args.base, args.overlay, args.manifest)
    if args.check:
        if rendered == current:
            return 0
        diff = difflib.unified_diff(
            current.splitlines(keepends=True),
            rendered.splitlines(keepends=True),
            f"{args.manifest} (committed)",
            f"{args.manifest} (rendered)",
        )
        sys.stderr.write("".join(diff))
        sys.stderr.write(
            f"{args.manifest} is out of date: run python scripts/render_rayservice.py\n"
        )
        return 1
    if rendered != current:
        args.manifest.write_text(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
