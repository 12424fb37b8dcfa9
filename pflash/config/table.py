"""The README "Configuration" table, generated from the components (a test checks README.md)."""

from __future__ import annotations

from pflash.config.model import COMPONENTS, _env_key


def config_table() -> str:
    """Markdown: one table of knobs per component, under a heading naming the component."""
    out = [
        "Every key may be written flat (`keep_ratio: 0.1`) or under its component "
        "(`gate: {keep_ratio: 0.1}`); attributes read flat too (`config.keep_ratio`). "
        "Environment names are always flat.",
    ]
    for name, component in COMPONENTS.items():
        summary = " ".join((component.__doc__ or "").split())
        out += ["", f"### `{name}`", "", summary, ""]
        out += ["| key | env | default | meaning |", "|---|---|---|---|"]
        for key, f in component.model_fields.items():
            out.append(f"| `{key}` | `{_env_key(key)}` | `{f.default!r}` | {f.description or ''} |")
    return "\n".join(out)
