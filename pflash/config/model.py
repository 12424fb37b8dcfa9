"""The whole config, the parts deployments receive, and loading them from YAML and environment.

Filled in this order: defaults (components.py, and only there) < a YAML file or dict (the
`serve_config.yaml` `args`/`user_config`) < `PFLASH_*` environment < the per-request fields
that may override (`with_request_overrides`). Every value is validated once, at load, and a
bad value fails with a message naming the key, the value and what is allowed.

Environment names are `PFLASH_` + the upper-cased flat key, so the reference's
strict-selection variables (`PFLASH_SELECT_MODE`, `PFLASH_SELECT_TOPK`, `PFLASH_CHAT_VIEW`,
...) keep their meaning. An empty environment value is an error, never "unset" (reference
§10.1 item 15).

Product defaults differ from the reference on purpose in one place: strict selection
(`select_mode: budget_only`, head scorer, `prompt_end` chat query, budget over droppable
tokens, views on) is the default, and `mode` is `auto` with a threshold suited to the
embedded model's 8K context. The legacy selector/scorer are opt-in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from pflash.config.artefacts import ARTEFACTS, embedded_refusal
from pflash.config.components import (
    EMBEDDED_HEAD_LAYER,
    EMBEDDED_PROJECTION_LAYERS,
    EMBEDDED_SHIPPED_LAYERS,
    EMBEDDED_SMOLLM2,
    Component,
    GateConfig,
    GenerationConfig,
    LexicalConfig,
    ScoringConfig,
    SecurityConfig,
    SelectionConfig,
    ServerConfig,
    ViewsConfig,
)
from pflash.config.flat import ComponentSet
from pflash.config.legacy import LegacySelectionConfig
from pflash.errors import ConfigError

ENV_PREFIX = "PFLASH_"

REMOVED_KEYS: dict[str, str] = {
    "view_trace_path": "view_trace_path was removed (nothing wrote it); use trace_path",
    "select_container_headers": (
        "select_container_headers was removed (the container-header experiment was never "
        "built; only false was accepted): delete the key"
    ),
    "select_container_header_max": (
        "select_container_header_max was removed (nothing read it): delete the key"
    ),
    "select_likelihood_weight": (
        "select_likelihood_weight was removed (question likelihood moved retention little at "
        "3-4x the compression time; docs/BENCHMARK_NOTEBOOK.md): delete the key; "
        "select_semantic_weight is the passage evidence that pays"
    ),
    "likelihood_passage_tokens": (
        "likelihood_passage_tokens was removed with question-likelihood evidence: delete the "
        "key; semantic_passage_tokens sizes the passages the embedder reads"
    ),
    "drafter_lookahead_tokens": (
        "drafter_lookahead_tokens was removed (look-ahead drafts kept nothing more at "
        "1.8-5.9x the compression time; docs/BENCHMARK_NOTEBOOK.md): delete the key"
    ),
    "drafter_lookahead_weight": (
        "drafter_lookahead_weight was removed with look-ahead drafts: delete the key"
    ),
    "assembly_cut_marker": (
        "assembly_cut_marker was removed (an assembly experiment no measurement kept): "
        "delete the key; select_paragraph_join still separates non-adjacent kept runs"
    ),
}
"""Keys that were once accepted -> what to do instead (an error, never silently ignored)."""

P = TypeVar("P", bound=BaseModel)


def evidence_weights(
    semantic: float | str,
    projection: float | str,
    *,
    projection_fits: bool,
) -> dict[str, float]:
    """The passage-evidence weights with `auto` resolved: the sentence embedder, sharing half
    and half with the tap projection where a shipped projection fits the drafter's scoring
    layer: together they find more evidence than either alone (docs/BENCHMARK_NOTEBOOK.md).
    A weight the operator set stays as set; an explicit semantic weight keeps an `auto`
    projection off, so a config that names only the semantic weight gets that signal alone."""
    if projection == "auto":
        projection = 0.5 if projection_fits and semantic == "auto" else 0.0
    if semantic == "auto":
        semantic = max(0.0, 1.0 - projection)
    return {
        "select_semantic_weight": round(float(semantic), 6),
        "select_projection_weight": round(float(projection), 6),
    }


class PFlashConfig(ComponentSet):
    """All PFlash settings, by component; every knob also readable flat (`config.keep_ratio`).

    The ingress holds this whole object and splits it: the request flow's stages take
    their components or parts (`AdmissionPart`, `CompressionPart`, `ViewPart`), the other
    deployments receive only theirs (`DrafterScorerPart`, `TargetModelPart`,
    `ScoringConfig`, `ViewsConfig`).
    """

    gate: GateConfig = Field(default_factory=GateConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    legacy: LegacySelectionConfig = Field(default_factory=LegacySelectionConfig)
    lexical: LexicalConfig = Field(default_factory=LexicalConfig)
    views: ViewsConfig = Field(default_factory=ViewsConfig)
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)

    @model_validator(mode="after")
    def _resolve_auto(self) -> PFlashConfig:
        """`auto` scoring settings become concrete here, so every reader sees one value: the
        embedded drafter's measured layer, head, probe and tap projection (the product
        default), none for any other drafter or where they cannot apply (legacy selection, a
        non-head scorer, a layer nothing ships for)."""
        s, sel = self.scoring, self.selection
        # a calibration picks the layer and weighs the base layer's heads: no trained head
        embedded = self.drafter == EMBEDDED_SMOLLM2 and self.strict and not self.drafter_calibration
        layer = s.drafter_head_layer
        if layer == "auto":
            layer = EMBEDDED_HEAD_LAYER if embedded and self.select_scorer == "head" else None
        shipped = embedded and layer in EMBEDDED_SHIPPED_LAYERS
        resolved = {
            "drafter_head_layer": layer,
            "scoring_head_gguf": "embedded" if shipped and self.select_scorer == "head" else None,
            "segment_probe_gguf": "embedded" if shipped else None,
            "projection_gguf": "embedded" if self.drafter == EMBEDDED_SMOLLM2 else None,
        }
        projection = "embedded" if s.projection_gguf == "auto" else s.projection_gguf
        fits = embedded and layer in EMBEDDED_PROJECTION_LAYERS and projection == "embedded"
        resolved |= evidence_weights(
            sel.select_semantic_weight,
            sel.select_projection_weight,
            projection_fits=fits,
        )
        for component in (s, sel):  # once, while the object is being built (frozen after)
            for key in type(component).model_fields:
                if getattr(component, key) == "auto" and key in resolved:
                    object.__setattr__(component, key, resolved[key])
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> PFlashConfig:
        # Cross-field errors are "key: allowed" so the error names the key (_format_error).
        if self.select_mode == "top_k" and self.select_topk <= 0:
            raise ValueError("select_topk: must be > 0 when select_mode is top_k")
        if self.select_mode == "top_k" and self.select_scorer == "split":
            raise ValueError("select_scorer: split does not support select_mode top_k")
        if self.scoring_head_gguf and self.select_mode == "legacy":
            raise ValueError(
                "scoring_head_gguf: a trained scoring head needs strict selection (select_mode not legacy)"
            )
        for kind, artefact in ARTEFACTS.items():
            refusal = embedded_refusal(kind, getattr(self, artefact.field), self.drafter)
            if refusal:
                raise ValueError(f"{artefact.field}: {refusal}")
        if self.select_semantic_weight + self.select_projection_weight > 1 + 1e-6:
            raise ValueError(
                "select_semantic_weight: select_semantic_weight + select_projection_weight must not exceed 1 (leave select_semantic_weight auto to give it what the projection leaves)"
            )
        if self.select_projection_weight > 0 and not self.projection_gguf:
            raise ValueError(
                "projection_gguf: select_projection_weight needs a tap projection for this drafter (a file from pflash projection train)"
            )
        if self.adaptive_min > self.adaptive_max:
            raise ValueError("adaptive_min: must not exceed adaptive_max")
        if self.repeat_min > self.repeat_max:
            raise ValueError("repeat_min: must not exceed repeat_max")
        if self.target_backend == "openai" and not self.upstream_base_url:
            raise ValueError("upstream_base_url: required when target_backend is openai")
        if self.target_backend == "ray_llm" and not self.upstream_model:
            raise ValueError(
                "upstream_model: required when target_backend is ray_llm (the model_id of its LLMConfig)"
            )
        return self

    # ------------------------------------------------------------------ derived
    @property
    def strict(self) -> bool:
        """Strict (budgeted) selection is active unless the legacy selector was chosen."""
        return self.selection.strict

    def with_request_overrides(
        self, overrides: RequestOverrides | None = None, **fields: Any
    ) -> PFlashConfig:
        """The config for one request: `pflash_mode` and `pflash_keep_ratio` may override
        (`RequestOverrides`, or its fields as keywords).

        Only the gate component is validated again and replaced; every other component is
        this config's own object. A request's keep ratio clears the `curve` (the curve would
        otherwise choose the ratio by length)."""
        overrides = overrides or RequestOverrides(**fields)
        updates = overrides.gate_updates()
        if not updates:
            return self
        try:
            gate = type(self.gate).model_validate({**self.gate.model_dump(), **updates})
        except ValidationError as err:
            raise _format_error(err, {**self.model_dump(), **updates}) from None
        return self.model_copy(update={"gate": gate})


@dataclass(frozen=True)
class RequestOverrides:
    """What one request may change in the server's config: its `pflash_mode` and
    `pflash_keep_ratio` (None: the server's)."""

    mode: str | None = None
    keep_ratio: float | None = None

    def gate_updates(self) -> dict[str, Any]:
        """The gate fields these overrides set."""
        updates: dict[str, Any] = {}
        if self.mode is not None:
            updates["mode"] = self.mode
        if self.keep_ratio is not None:
            updates["keep_ratio"] = self.keep_ratio
            updates["curve"] = ()
        return updates


class DrafterScorerPart(ComponentSet):
    """What the DrafterScorer reads: the drafter, from selection `select_mode` (legacy
    scores) and `select_segments` (the in-process probe), and the legacy scorer's
    `legacy_query_tokens` and `legacy_pool_kernel`."""

    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    legacy: LegacySelectionConfig = Field(default_factory=LegacySelectionConfig)


class CompressionPart(ComponentSet):
    """What one prompt's compression reads (`pipeline.prepare`, `finish.finish`): the gate,
    selection, the legacy selector, lexical evidence, and from scoring whether a segment
    probe is loaded (`segment_probe_gguf`). Taken from the request's config where the flow
    splits it (`Compressor`)."""

    gate: GateConfig = Field(default_factory=GateConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    legacy: LegacySelectionConfig = Field(default_factory=LegacySelectionConfig)
    lexical: LexicalConfig = Field(default_factory=LexicalConfig)
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)


class ViewPart(CompressionPart):
    """What the view decision reads (`views.decision.decide_view`): the views, and what a
    compression reads, since a view is reused only under the digest of the components that
    decided its selection (`views.keys.SELECTION_COMPONENTS`) and its fresh compressions run
    from it."""

    views: ViewsConfig = Field(default_factory=ViewsConfig)


class AdmissionPart(ComponentSet):
    """What a request is checked against before it is rendered
    (`GenerationRequest.check_allowed`): the server's model names and limits, and from
    selection whether it is strict (`pflash_required` needs it)."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)


class TargetModelPart(ComponentSet):
    """What the TargetModel reads: the target, and from scoring `device` and the drafter
    (`drafter`, `drafter_tokenizer`), the speculative assistant's default."""

    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)


COMPONENTS: dict[str, type[Component]] = {
    name: info.annotation for name, info in PFlashConfig.model_fields.items()
}
"""Component name -> its model, in the order of docs/CONFIGURATION.md."""

FIELDS: dict[str, str] = dict(PFlashConfig.component_of)
"""Every flat key (YAML key, `PFLASH_*` name, attribute) -> the component holding it."""


SECRETS: frozenset[str] = frozenset(
    key for model in COMPONENTS.values() for key, f in model.model_fields.items() if not f.repr
)
"""The flat keys whose values are secrets (`repr=False` on their field): no error, log line or
repr shows them (`shown`)."""


def shown(key: str, value: Any) -> Any:
    """`value` as an error message may show it under `key`: a secret (or an element of one,
    `api_keys.1`) only as `<redacted>`."""
    return "<redacted>" if key.split(".", 1)[0] in SECRETS else value


def _error(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(key, shown(key, value), allowed)


def field_info(key: str) -> FieldInfo:
    """The definition (type, default, bounds, description) of the flat key `key`."""
    return COMPONENTS[FIELDS[key]].model_fields[key]


# ---------------------------------------------------------------------- loading


def _env_key(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _parse_env_value(field: str, raw: str) -> Any:
    """Turn an environment string into the field's type; strict (\"12x\" is not an int)."""
    if raw.strip() == "":
        raise _error(field, raw, f"{_env_key(field)} is set but empty; unset it or give a value")
    annotation = field_info(field).annotation
    kinds = {a for a in (get_args(annotation) or (annotation,)) if a is not type(None)}
    if bool in kinds:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise _error(field, raw, "a boolean: 1/0, true/false, on/off")
    if field in ("api_keys", "served_model_names", "trusted_proxies"):  # comma or space separated
        return tuple(k for k in raw.replace(",", " ").split() if k)
    if field == "instruction_tags":  # comma separated: a tag name may hold a space
        return tuple(k.strip() for k in raw.split(",") if k.strip())
    if field == "curve":
        return raw
    if int in kinds:
        try:
            return int(raw.strip(), 10)
        except ValueError:
            raise _error(field, raw, "an integer") from None
    if float in kinds:
        try:
            return float(raw.strip())
        except ValueError:
            raise _error(field, raw, "a number") from None
    return raw


def _given(data: Mapping[str, Any], key: str) -> Any:
    """The value `data` (flat or nested) gives the flat key `key`, else its default."""
    if key in data:
        return data[key]
    values = data.get(FIELDS[key])
    if isinstance(values, Mapping) and key in values:
        return values[key]
    return field_info(key).default


def _unknown_key(loc: tuple[str, ...]) -> str:
    *where, key = loc
    if key in REMOVED_KEYS:
        return REMOVED_KEYS[key]
    if not where:
        return (
            "unknown key; known keys: "
            + ", ".join(FIELDS)
            + "; or a component: "
            + ", ".join(COMPONENTS)
        )
    component = where[0]
    if key in FIELDS:
        return f"{key} belongs to {FIELDS[key]}, not {component}; write it flat or there"
    return f"unknown key in {component}; its keys: " + ", ".join(COMPONENTS[component].model_fields)


def _format_error(err: ValidationError, data: Mapping[str, Any]) -> ConfigError:
    first = err.errors()[0]
    loc = tuple(str(p) for p in first.get("loc", ()))
    allowed = first.get("msg", "invalid")
    if not loc:  # a cross-field check: its message is "key: allowed"
        msg = allowed.removeprefix("Value error, ")
        key, _, allowed = msg.partition(": ")
        return _error(key, _given(data, key), allowed)
    if first.get("type") == "extra_forbidden":
        # an unknown key's value is never shown: it may be a misspelt secret (`api_key:`)
        return ConfigError(".".join(loc), "<redacted>", _unknown_key(loc))
    if loc[0] in COMPONENTS and len(loc) > 1:  # a component's field: named flat, as written
        loc = loc[1:]
    # a union's branch (`drafter_head_layer.constrained-int`): the field is what was written
    branch = len(loc) > 1 and loc[0] in FIELDS and not loc[1].isdigit()
    if branch:
        loc = loc[:1]
    key = ".".join(loc)
    if key not in FIELDS:  # an element (`api_keys.0`) or a component that is not a mapping
        return _error(key, first.get("input"), allowed)
    field = field_info(key)
    args = get_args(field.annotation)
    literals = [a for a in args if isinstance(a, str)]
    nested = [get_args(a) for a in args if get_origin(a) is Literal]
    if literals or nested:
        choices = literals or [c for n in nested for c in n]
        allowed = f"{allowed}, or one of " if branch else "one of "
        allowed += ", ".join(choices)
    elif field.description:
        allowed = f"{allowed} ({field.description})"
    return _error(key, _given(data, key), allowed)


def build_config(
    data: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> PFlashConfig:
    """Defaults < `data` (YAML/dict, flat or nested keys) < `PFLASH_*` entries of `env`
    (os.environ when None)."""
    env = os.environ if env is None else env
    for key, why in REMOVED_KEYS.items():
        if _env_key(key) in env:
            raise ConfigError(_env_key(key), env[_env_key(key)], why)
    overrides = {f: _parse_env_value(f, env[_env_key(f)]) for f in FIELDS if _env_key(f) in env}
    merged = {**PFlashConfig.nest(data or {}), **overrides}  # flat keys after: env wins
    try:
        return PFlashConfig(**merged)
    except ValidationError as err:
        raise _format_error(err, merged) from None


def build_part(
    part: type[P], data: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> P:
    """The `part` of `build_config(data, env)`, for a deployment given only its part's keys.

    The whole config is validated (a bad value or unknown key anywhere fails here too, and
    a `user_config` may name any knob); the other components come from defaults and env.
    """
    return build_config(data, env).part(part)


def load_config(
    path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None
) -> PFlashConfig:
    """Load a YAML file of config keys (or only defaults and env when `path` is None)."""
    data: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError("config", str(path), "a YAML mapping of config keys")
        data = loaded
    return build_config(data, env)
