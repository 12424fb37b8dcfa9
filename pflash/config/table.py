"""The configuration tables, generated from the components so they never drift: the full
table of every knob (docs/CONFIGURATION.md) and the short table of the knobs a deployment
usually sets (README.md). `scripts/render_config_table.py` rewrites both; a test checks them."""

from __future__ import annotations

from pflash.config.model import COMPONENTS, FIELDS, _env_key, field_info

KNOBS: tuple[str, ...] = (
    # models and where they run
    "drafter",
    "target",
    "device",
    # how much is compressed
    "mode",
    "threshold",
    "keep_ratio",
    # who serves the target
    "target_backend",
    "upstream_base_url",
    "upstream_model",
    "upstream_api_key",
    # limits
    "max_body_bytes",
    "body_read_timeout_s",
    "max_messages",
    "max_prompt_tokens",
    "max_output_tokens",
    "request_timeout_s",
    "remote_call_timeout_s",
    # security
    "api_keys",
    "anonymous_tenant",
    "trusted_proxies",
    "tenant_secret",
    "return_prompt_enabled",
    # behaviour
    "chat_view",
    "adaptive_keep",
    "on_drafter_error",
    "tool_call_parser",
    "trace_path",
    "served_model_names",
)
"""The README's "Knobs you will change", in its order: the ones a deployment sets; the rest
keep their measured defaults (docs/CONFIGURATION.md lists them all)."""


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


def knobs_table(keys: tuple[str, ...] = KNOBS) -> str:
    """Markdown: the rows of the full table for `keys`, in that order, with their component
    (so a reader finds the row in the full table)."""
    out = ["| key | component | default | meaning |", "|---|---|---|---|"]
    for key in keys:
        f = field_info(key)
        out.append(f"| `{key}` | {FIELDS[key]} | `{f.default!r}` | {f.description or ''} |")
    return "\n".join(out)
