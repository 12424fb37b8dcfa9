"""Every PFlash knob in one typed, validated object.

Filled in this order: defaults (here, and only here) < a YAML file or dict (the
`serve_config.yaml` `args`/`user_config`) < `PFLASH_*` environment < the per-request fields
that may override (`with_request_overrides`). Every value is validated once, at load, and a
bad value fails with a message naming the key, the value and what is allowed.

Environment names are `PFLASH_` + the upper-cased key, so the reference's strict-selection
variables (`PFLASH_SELECT_MODE`, `PFLASH_SELECT_TOPK`, `PFLASH_CHAT_VIEW`, ...) keep their
meaning. An empty environment value is an error, never "unset" (reference §10.1 item 15).

Product defaults differ from the reference on purpose in one place: strict selection
(`select_mode: budget_only`, head scorer, `prompt_end` chat query, budget over droppable
tokens, views on) is the default, and `mode` is `auto` with a threshold suited to the
embedded model's 8K context. The legacy selector/scorer are opt-in.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pflash.errors import ConfigError

ENV_PREFIX = "PFLASH_"
EMBEDDED_SMOLLM2 = "embedded:smollm2-135m"

Mode = Literal["off", "auto", "always"]
SelectMode = Literal["budget_only", "top_p", "top_k", "legacy"]
QueryParser = Literal["arbitrary_tail", "latest_user"]
SegmentsMode = Literal["auto", "fixed", "probe"]
ScoreMode = Literal["auto", "sum", "density"]
ScorerKind = Literal["head", "legacy", "split"]
DrafterProfile = Literal["auto", "generic", "qwen3", "qwen35"]
TargetBackend = Literal["transformers", "openai"]
OnDrafterError = Literal["fail", "bypass"]
LexicalMode = Literal["off", "anchors", "cascade"]
LexicalQuery = Literal["question", "tail"]
PositionPrior = Literal["off", "distance"]


class PFlashConfig(BaseModel):
    """All PFlash settings. Field descriptions are the documentation (README table)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    # --- gating and budget (reference §5.1, §5.7)
    mode: Mode = Field(
        "auto", description="Compression: off, auto (when droppable tokens >= threshold), always."
    )
    threshold: int = Field(
        2048,
        ge=0,
        description="auto mode compresses when the droppable part of the prompt has at least this many target tokens (the reference's 32000 is for 128K models).",
    )
    keep_ratio: float = Field(
        0.05, gt=0, le=1, description="Configured keep ratio r0 over droppable tokens, in (0, 1]."
    )
    curve: tuple[tuple[int, float], ...] = Field(
        (),
        description='Piecewise-linear keep ratio by target prompt tokens, "tokens:ratio" points (e.g. "10000:0.5 40000:0.2"); clamped flat at both ends; overrides keep_ratio.',
    )

    # --- strict selection (reference §4.3)
    select_mode: SelectMode = Field(
        "budget_only", description="budget_only, top_p, top_k, or legacy (the v1 selector)."
    )
    select_chunk_size: int | None = Field(
        None,
        gt=0,
        description="Fixed chunk size in drafter tokens; unset = schedule by length (<500:128, <3000:512, else 1024).",
    )
    select_query_tokens: int = Field(
        8, ge=1, le=512, description="Scorer query window width in tokens, [1, 512]."
    )
    select_query_parser: QueryParser = Field(
        "arbitrary_tail", description="arbitrary_tail (chat-first prompt_end) or latest_user."
    )
    select_top_p: float = Field(
        0.95, gt=0, le=1, description="top_p mode: cumulative score mass to keep, in (0, 1]."
    )
    select_topk: int = Field(
        0,
        ge=0,
        description="top_k mode: optional candidates to keep; required (> 0) in top_k mode.",
    )
    select_segments: SegmentsMode = Field(
        "auto", description="auto (probe when loaded and >= 4 boundaries), fixed, or probe."
    )
    select_score: ScoreMode = Field(
        "auto",
        description="Candidate score: auto (sum for fixed chunks, density for probe segments), sum, density.",
    )
    select_scorer: ScorerKind = Field(
        "head",
        description="head (attention mass), legacy (running max + pooling), or split (both).",
    )
    select_split: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="split scorer: the head scorer's share of the budget, in (0, 1).",
    )
    select_paragraph_join: bool = Field(
        True, description="Insert paragraph breaks between non-adjacent kept runs."
    )
    select_container_headers: bool = Field(
        False,
        description="Assembly experiment: re-insert container headers (paid inside the budget).",
    )
    select_container_header_max: int = Field(
        48, ge=1, le=4096, description="Assembly experiment: longest container header in tokens."
    )
    assembly_cut_marker: bool = Field(
        False,
        description='Assembly experiment: write "\\n[...]\\n" at cuts (paid inside the budget).',
    )

    # --- small-drafter quality: lexical evidence, position prior (issue 10)
    select_lexical: LexicalMode = Field(
        "cascade",
        description="Lexical evidence in strict selection: `anchors` ranks candidates sharing rare words or word n-grams with the question first (inside the budget); `cascade` also follows rare words out of anchored text (multi-hop); `off` = attention only.",
    )
    lexical_query: LexicalQuery = Field(
        "question",
        description="Lexical query pool: `question` = the question-like sentences of the latest user turn wherever they sit (+ pflash_query); `tail` = its last anchor_query_tokens tokens (reference).",
    )
    lexical_rare_max_freq: int = Field(
        2,
        ge=1,
        le=64,
        description="Cascade: a word links text when it occurs at most this often in the context.",
    )
    lexical_cascade_iters: int = Field(
        8,
        ge=1,
        le=16,
        description="Cascade: rare-word rounds, one hop each (the longest chain followed).",
    )
    lexical_max_share: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Share of the droppable budget lexical anchors may take before attention fills the rest.",
    )
    select_position_prior: PositionPrior = Field(
        "distance",
        description="Rank candidates by attention lift over a position prior (`distance`: the median mass at the same distance from the query), so the attention sink and the recency band do not crowd out the context.",
    )
    drafter_lookahead_tokens: int = Field(
        0,
        ge=0,
        le=64,
        description="Look-ahead queries: the drafter greedily decodes this many answer tokens (a full drafter forward) and their attention rows join the query windows; 0 = off.",
    )
    drafter_lookahead_weight: float = Field(
        1.0, gt=0, le=16, description="Weight of the look-ahead window in the mass mix."
    )
    drafter_calibration: str | None = Field(
        None,
        description="Calibration file from `pflash calibrate` (scoring layer and per-head weights) for this drafter; `embedded` = the file shipped for embedded:smollm2-135m.",
    )

    # --- chat parsing, pins, history (reference §5.3-§5.6)
    chat_skeleton_tokens: int = Field(
        256,
        ge=0,
        le=1 << 20,
        description="Turns up to this many tokens are kept whole (dialogue skeleton); 0 disables.",
    )
    chat_question_pin_tokens: int = Field(
        64,
        ge=0,
        le=4096,
        description="Keep the question at the end of the latest user turn verbatim: its last line or sentences, up to this many drafter tokens (0 = the reference's behaviour, which may cut the question mid-sentence).",
    )
    chat_history_queries: int = Field(
        3,
        ge=0,
        le=8,
        description="Earlier user questions used as extra scorer queries (weights 1/2, 1/4, ...).",
    )

    # --- views and recall (reference §6.1, §6.2)
    chat_view: bool = Field(
        True, description="Keep a compressed view per conversation that later turns extend."
    )
    chat_recall: bool = Field(
        True, description="Recall dropped segments that a new question attends to."
    )
    chat_recall_min_lift: float = Field(
        2.0, gt=0, description="Recall a segment when its attention lift is at least this."
    )
    chat_compress_new_tokens: int = Field(
        16384,
        ge=1,
        description="Compress a turn's new material when it has at least this many target tokens.",
    )
    view_capacity: int = Field(1024, ge=1, description="Views kept by the session store (LRU).")
    view_ttl_s: float = Field(3600.0, gt=0, description="Seconds a view lives without use.")

    # --- adaptive keep ratio (reference §6.6)
    adaptive_keep: bool = Field(
        True, description="Per-session keep ratio moved by the target's speculative acceptance."
    )
    adaptive_min: float = Field(0.025, gt=0, le=1, description="Adaptive keep ratio lower bound.")
    adaptive_max: float = Field(0.20, gt=0, le=1, description="Adaptive keep ratio upper bound.")
    adaptive_sessions: int = Field(
        1024, ge=1, description="Sessions tracked by the adaptive controller (LRU)."
    )

    # --- legacy selector and scorer (reference §3.1, §4.1)
    legacy_chunk_size: int = Field(32, gt=0, description="Legacy selector chunk size.")
    legacy_query_tokens: int = Field(
        8, ge=1, le=512, description="Legacy tail scorer query rows (n_lookahead)."
    )
    legacy_pool_kernel: int = Field(
        13, ge=1, description="Legacy score smoothing width (in-range mean)."
    )
    legacy_head_chunks: int = Field(8, ge=0, description="Legacy: chunks forced at the head.")
    legacy_tail_chunks: int = Field(24, ge=0, description="Legacy: chunks forced at the tail.")
    anchor_query_tokens: int = Field(
        96, ge=0, description="Legacy 4-gram anchors: the query pool is the last this many tokens."
    )
    anchor_radius: int | None = Field(
        None, ge=0, description="4-gram anchor radius in chunks; unset = tier by length."
    )
    anchor_max_hits: int | None = Field(
        None, ge=0, description="4-gram anchor hit cap; unset = tier by length."
    )
    repeat_min: int = Field(
        4, ge=1, description="Qwen3.5 legacy repeat-token rule: minimum frequency."
    )
    repeat_max: int = Field(
        32, ge=1, description="Qwen3.5 legacy repeat-token rule: maximum frequency."
    )
    legacy_repeat_rule: bool | None = Field(
        None, description="Legacy repeat-token rule; unset = by drafter profile (on for qwen35)."
    )

    # --- models
    drafter: str = Field(
        EMBEDDED_SMOLLM2,
        description="Drafter model: a GGUF file, a local HF directory, or embedded:smollm2-135m.",
    )
    drafter_tokenizer: str | None = Field(
        None, description="Drafter tokenizer source when it differs from the drafter model."
    )
    drafter_profile: DrafterProfile = Field(
        "auto", description="Scorer profile; auto reads the architecture from the model."
    )
    drafter_head_layer: int | None = Field(
        None,
        ge=0,
        description="Scoring layer (any profile); unset = the profile default (generic: 57% of depth, measured).",
    )
    drafter_chunk_tokens: int = Field(
        1024, ge=16, description="Drafter forward chunk (rows per step); bounds activation memory."
    )
    drafter_sessions: int = Field(
        2,
        ge=0,
        le=16,
        description="Per-conversation drafter scoring sessions kept (LRU); 0 = none.",
    )
    scoring_head_gguf: str | None = Field(
        None,
        description="Trained scoring head GGUF bound to the drafter file by sha256; `embedded` = the head shipped for embedded:smollm2-135m (pflash head train reproduces it).",
    )
    segment_probe_gguf: str | None = Field(
        None,
        description="Segment probe GGUF bound to the drafter file by sha256; `embedded` = the probe shipped for embedded:smollm2-135m (pflash probe train reproduces it).",
    )
    target: str = Field(
        EMBEDDED_SMOLLM2,
        description="Target model for the transformers backend (same sources as drafter).",
    )
    target_tokenizer: str | None = Field(
        None, description="Target tokenizer source when it differs from the target model."
    )
    target_backend: TargetBackend = Field(
        "transformers", description="transformers (in process) or openai (an upstream server)."
    )
    upstream_base_url: str | None = Field(
        None, description="openai backend: the upstream base URL (…/v1)."
    )
    upstream_api_key: str | None = Field(None, description="openai backend: the upstream API key.")
    upstream_model: str | None = Field(None, description="openai backend: the upstream model name.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where the drafter and an in-process target run: auto (cuda when a GPU is visible to the replica, else cpu), cpu, cuda.",
    )
    speculative_tokens: int = Field(
        0,
        ge=0,
        le=16,
        description="transformers target: draft tokens per speculative step for greedy requests, 1..16; 0 = off. The acceptance drives adaptive_keep.",
    )
    speculative_drafter: str | None = Field(
        None,
        description="Assistant model for speculative decoding (same sources as drafter; must share the target's tokenizer); unset = the drafter model.",
    )
    max_context: int | None = Field(
        None, gt=0, description="Target context length; unset = read from the target model."
    )

    # --- serving
    on_drafter_error: OnDrafterError = Field(
        "fail", description="fail (5xx naming the stage) or bypass (serve uncompressed, counted)."
    )
    return_prompt_enabled: bool = Field(
        False, description="Allow requests to set pflash_return_prompt."
    )
    api_keys: tuple[str, ...] = Field(
        (),
        description="Accepted API keys; empty = no auth. A key's tenant scopes views and sessions.",
    )
    max_body_bytes: int = Field(16 << 20, ge=1024, description="Largest accepted request body.")

    # --- traces
    trace_path: str | None = Field(None, description="JSONL selection trace path; unset = off.")
    view_trace_path: str | None = Field(
        None, description="JSONL served-prompt trace path; unset = off."
    )

    # ------------------------------------------------------------------ validation
    @field_validator("select_top_p", "keep_ratio", "chat_recall_min_lift", "select_split")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("mode", "select_lexical", "select_position_prior", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false: `mode: off` in serve_config.yaml means "off"
        return "off" if v is False else v

    @field_validator("curve", mode="before")
    @classmethod
    def _parse_curve(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.replace(",", " ").split()
        points = []
        for p in v or ():
            if isinstance(p, str):
                if p.count(":") != 1:
                    raise ValueError(f'curve point {p!r} is not "tokens:ratio"')
                t, r = p.split(":")
                p = (int(t), float(r))
            t, r = int(p[0]), float(p[1])
            if t < 0 or not (0 < r <= 1) or not math.isfinite(r):
                raise ValueError(f"curve point {t}:{r} needs tokens >= 0 and ratio in (0, 1]")
            points.append((t, r))
        return tuple(sorted(points))

    @model_validator(mode="after")
    def _cross_checks(self) -> PFlashConfig:
        # Cross-field errors are "key: allowed" so the error names the key (_format_error).
        if self.select_mode == "top_k" and self.select_topk <= 0:
            raise ValueError("select_topk: must be > 0 when select_mode is top_k")
        if self.select_mode == "top_k" and self.select_scorer == "split":
            raise ValueError("select_scorer: split does not support select_mode top_k")
        if self.select_container_headers:
            raise ValueError(
                "select_container_headers: not available yet (the container-header assembly "
                "experiment is not implemented); leave it false"
            )
        if self.scoring_head_gguf and self.select_mode == "legacy":
            raise ValueError(
                "scoring_head_gguf: a trained scoring head needs strict selection (select_mode not legacy)"
            )
        if self.segment_probe_gguf == "embedded" and self.drafter != EMBEDDED_SMOLLM2:
            raise ValueError(
                f"segment_probe_gguf: 'embedded' is the probe for {EMBEDDED_SMOLLM2}; give a probe GGUF trained for this drafter (pflash probe train)"
            )
        if self.scoring_head_gguf == "embedded" and self.drafter != EMBEDDED_SMOLLM2:
            raise ValueError(
                f"scoring_head_gguf: 'embedded' is the head for {EMBEDDED_SMOLLM2}; give a head GGUF trained for this drafter (pflash head train)"
            )
        if self.drafter_calibration == "embedded" and self.drafter != EMBEDDED_SMOLLM2:
            raise ValueError(
                f"drafter_calibration: 'embedded' is the calibration for {EMBEDDED_SMOLLM2}; run pflash calibrate for this drafter"
            )
        if self.adaptive_min > self.adaptive_max:
            raise ValueError("adaptive_min: must not exceed adaptive_max")
        if self.repeat_min > self.repeat_max:
            raise ValueError("repeat_min: must not exceed repeat_max")
        if self.target_backend == "openai" and not self.upstream_base_url:
            raise ValueError("upstream_base_url: required when target_backend is openai")
        return self

    # ------------------------------------------------------------------ derived
    @property
    def strict(self) -> bool:
        """Strict (budgeted) selection is active unless the legacy selector was chosen."""
        return self.select_mode != "legacy"

    def with_request_overrides(
        self, *, mode: str | None = None, keep_ratio: float | None = None
    ) -> PFlashConfig:
        """The config for one request: `pflash_mode` and `pflash_keep_ratio` may override."""
        updates: dict[str, Any] = {}
        if mode is not None:
            updates["mode"] = mode
        if keep_ratio is not None:
            updates["keep_ratio"] = keep_ratio
            updates["curve"] = ()
        if not updates:
            return self
        return build_config({**self.model_dump(), **updates}, env={})


# ---------------------------------------------------------------------- loading

_FIELD_NAMES = tuple(PFlashConfig.model_fields)


def _env_key(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _parse_env_value(field: str, raw: str) -> Any:
    """Turn an environment string into the field's type; strict (\"12x\" is not an int)."""
    if raw.strip() == "":
        raise ConfigError(
            field, raw, f"{_env_key(field)} is set but empty; unset it or give a value"
        )
    annotation = PFlashConfig.model_fields[field].annotation
    kinds = {a for a in (get_args(annotation) or (annotation,)) if a is not type(None)}
    origin = get_origin(annotation)
    if bool in kinds:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(field, raw, "a boolean: 1/0, true/false, on/off")
    if field == "api_keys":
        return tuple(k for k in raw.replace(",", " ").split() if k)
    if field == "curve":
        return raw
    if int in kinds:
        try:
            return int(raw.strip(), 10)
        except ValueError:
            raise ConfigError(field, raw, "an integer") from None
    if float in kinds:
        try:
            return float(raw.strip())
        except ValueError:
            raise ConfigError(field, raw, "a number") from None
    del origin
    return raw


def _format_error(err: ValidationError, data: Mapping[str, Any]) -> ConfigError:
    first = err.errors()[0]
    key = ".".join(str(p) for p in first.get("loc", ())) or "config"
    allowed = first.get("msg", "invalid")
    if key == "config":  # a cross-field check: its message is "key: allowed"
        msg = allowed.removeprefix("Value error, ")
        key, _, allowed = msg.partition(": ")
        return ConfigError(key, data.get(key, PFlashConfig.model_fields[key].default), allowed)
    value = data.get(key, first.get("input"))
    field = PFlashConfig.model_fields.get(key)
    if field is not None:
        args = get_args(field.annotation)
        literals = [a for a in args if isinstance(a, str)]
        nested = [get_args(a) for a in args if get_origin(a) is Literal]
        if literals or nested:
            choices = literals or [c for n in nested for c in n]
            allowed = f"one of {', '.join(choices)}"
        elif field.description:
            allowed = f"{allowed} ({field.description})"
    elif first.get("type") == "extra_forbidden":
        allowed = "unknown key; known keys: " + ", ".join(_FIELD_NAMES)
    return ConfigError(key, value, allowed)


def build_config(
    data: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> PFlashConfig:
    """Defaults < `data` (YAML/dict) < `PFLASH_*` entries of `env` (os.environ when None)."""
    merged: dict[str, Any] = dict(data or {})
    env = os.environ if env is None else env
    for field in _FIELD_NAMES:
        key = _env_key(field)
        if key in env:
            merged[field] = _parse_env_value(field, env[key])
    try:
        return PFlashConfig(**merged)
    except ValidationError as err:
        raise _format_error(err, merged) from None


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


def config_table() -> str:
    """Markdown table of every knob (README "Configuration" is checked against this)."""
    rows = ["| key | env | default | meaning |", "|---|---|---|---|"]
    for name, f in PFlashConfig.model_fields.items():
        default = f.default
        rows.append(f"| `{name}` | `{_env_key(name)}` | `{default!r}` | {f.description or ''} |")
    return "\n".join(rows)
