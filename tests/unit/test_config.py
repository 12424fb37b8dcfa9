"""PFlashConfig: defaults, precedence, and error messages that name key, value and allowed;
the components it is nested by, the flat names that keep working, and the parts deployments
receive."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from pflash.config import (
    COMPONENTS,
    FIELDS,
    KNOBS,
    DrafterScorerPart,
    PFlashConfig,
    RequestOverrides,
    ScoringConfig,
    TargetModelPart,
    ViewsConfig,
    build_config,
    build_part,
    config_table,
    knobs_table,
    load_config,
)
from pflash.config.model import SECRETS
from pflash.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_product_defaults_are_strict_selection_with_auto_mode():
    cfg = build_config(env={})
    assert cfg.select_mode == "budget_only"
    assert cfg.strict is True
    assert cfg.select_scorer == "head"
    assert cfg.select_query_parser == "arbitrary_tail"
    assert cfg.mode == "auto"
    assert cfg.keep_ratio == 0.1
    assert cfg.select_top_p == 0.95
    assert cfg.select_query_tokens == 8
    assert cfg.chat_view is True and cfg.chat_recall is True
    assert cfg.chat_recall_min_lift == 2.0
    assert cfg.chat_compress_new_tokens == 256
    assert cfg.drafter_sessions == 2
    assert cfg.chat_skeleton_tokens == 256
    assert cfg.chat_history_queries == 3


def test_environment_overrides_yaml_which_overrides_defaults(tmp_path):
    path = tmp_path / "pflash.yaml"
    path.write_text("keep_ratio: 0.2\nselect_mode: top_p\nthreshold: 100\n")
    cfg = load_config(path, env={"PFLASH_KEEP_RATIO": "0.3"})
    assert cfg.keep_ratio == 0.3
    assert cfg.select_mode == "top_p"
    assert cfg.threshold == 100


def test_reference_environment_names_keep_their_meaning():
    env = {
        "PFLASH_SELECT_MODE": "top_k",
        "PFLASH_SELECT_TOPK": "4",
        "PFLASH_SELECT_CHUNK_SIZE": "256",
        "PFLASH_CHAT_VIEW": "0",
        "PFLASH_CHAT_RECALL_MIN_LIFT": "3.5",
    }
    cfg = build_config(env=env)
    assert (cfg.select_mode, cfg.select_topk, cfg.select_chunk_size) == ("top_k", 4, 256)
    assert cfg.chat_view is False
    assert cfg.chat_recall_min_lift == 3.5


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"PFLASH_SELECT_MODE": "TOP_P"}, "select_mode"),
        ({"PFLASH_SELECT_CHUNK_SIZE": "12x"}, "select_chunk_size"),
        ({"PFLASH_SELECT_CHUNK_SIZE": "0"}, "select_chunk_size"),
        ({"PFLASH_SELECT_QUERY_TOKENS": "513"}, "select_query_tokens"),
        ({"PFLASH_SELECT_TOP_P": "nan"}, "select_top_p"),
        ({"PFLASH_SELECT_TOP_P": "1.01"}, "select_top_p"),
        ({"PFLASH_KEEP_RATIO": ""}, "keep_ratio"),
        ({"PFLASH_CHAT_VIEW": "maybe"}, "chat_view"),
    ],
)
def test_invalid_value_names_key_value_and_allowed(env, key):
    with pytest.raises(ConfigError) as err:
        build_config(env=env)
    assert err.value.key == key
    raw = next(iter(env.values()))
    assert repr(raw) in str(err.value) or raw in str(err.value)
    assert err.value.allowed


def test_enum_error_lists_the_allowed_values():
    with pytest.raises(ConfigError) as err:
        build_config({"mode": "sometimes"}, env={})
    assert "off, auto, always" in err.value.allowed


def test_unknown_key_is_rejected_with_the_known_keys():
    with pytest.raises(ConfigError) as err:
        build_config({"keep_ration": 0.1}, env={})
    assert err.value.key == "keep_ration"
    assert "keep_ratio" in err.value.allowed


def test_top_k_mode_requires_top_k():
    with pytest.raises(ConfigError) as err:
        build_config({"select_mode": "top_k"}, env={})
    assert err.value.key == "select_topk"
    assert err.value.value == 0
    assert "top_k" in err.value.allowed


def test_curve_parses_sorts_and_validates_points():
    cfg = build_config({"curve": "40000:0.2 10000:0.5 100000:0.1"}, env={})
    assert cfg.curve == ((10000, 0.5), (40000, 0.2), (100000, 0.1))
    with pytest.raises(ConfigError):
        build_config({"curve": "10000:1.5"}, env={})
    with pytest.raises(ConfigError):
        build_config({"curve": "10000-0.5"}, env={})


def test_a_request_override_replaces_the_gate_only_and_equals_a_rebuilt_config():
    """A per-request override validates and replaces the gate component alone: every other
    component is the server config's own object, and the result equals the config rebuilt
    from scratch with those values."""
    base = build_config({"curve": "1000:0.5 2000:0.2", "select_mode": "budget_only"}, env={})
    for overrides in (
        RequestOverrides(mode="always"),
        RequestOverrides(keep_ratio=0.3),
        RequestOverrides(mode="off", keep_ratio=1.0),
    ):
        cfg = base.with_request_overrides(overrides)
        rebuilt = build_config({**base.model_dump(), **overrides.gate_updates()}, env={})
        assert cfg.model_dump() == rebuilt.model_dump()
        assert all(
            getattr(cfg, name) is getattr(base, name) for name in COMPONENTS if name != "gate"
        )
    assert base.with_request_overrides(RequestOverrides()) is base


def test_request_overrides_replace_mode_and_keep_ratio_only():
    base = build_config({"curve": "1000:0.5 2000:0.2"}, env={})
    cfg = base.with_request_overrides(mode="always", keep_ratio=0.25)
    assert cfg.mode == "always" and cfg.keep_ratio == 0.25 and cfg.curve == ()
    assert base.mode == "auto"
    with pytest.raises(ConfigError):
        base.with_request_overrides(keep_ratio=0.0)


def test_config_table_documents_every_field_under_its_component():
    table = config_table()
    for name in FIELDS:
        assert f"`{name}`" in table
        assert f"`PFLASH_{name.upper()}`" in table
    for component, model in COMPONENTS.items():
        section = table.split(f"### `{component}`\n", 1)[1].split("### ", 1)[0]
        assert [row.split("`")[1] for row in section.splitlines() if row.startswith("| `")] == list(
            model.model_fields
        )


def _generated(path: Path, marker: str) -> str:
    """What lies between `<!-- marker:begin -->` and `<!-- marker:end -->` in `path`."""
    text = path.read_text(encoding="utf-8")
    begin = text.index(f"<!-- {marker}:begin -->") + len(f"<!-- {marker}:begin -->")
    return text[begin : text.index(f"<!-- {marker}:end -->")].strip()


def test_configuration_doc_table_matches_the_config():
    assert _generated(ROOT / "docs" / "CONFIGURATION.md", "config-table") == (
        config_table().strip()
    ), "docs/CONFIGURATION.md is stale: run python scripts/render_config_table.py"


def test_readme_knobs_table_matches_the_config():
    assert _generated(ROOT / "README.md", "knobs-table") == knobs_table().strip(), (
        "README's knobs table is stale: run python scripts/render_config_table.py"
    )


def test_readme_knobs_are_real_keys_listed_once_and_few():
    assert len(KNOBS) <= 30
    assert len(set(KNOBS)) == len(KNOBS)
    assert set(KNOBS) <= set(FIELDS)
    rows = [row.split("`")[1] for row in knobs_table().splitlines() if row.startswith("| `")]
    assert rows == list(KNOBS)
    keep_ratio = next(row for row in knobs_table().splitlines() if row.startswith("| `keep_ratio`"))
    assert keep_ratio.split(" | ")[1:3] == ["gate", "`0.1`"]


@pytest.mark.parametrize("key", ["mode", "select_lexical", "select_position_prior"])
def test_bare_yaml_off_means_off(key):

    assert getattr(build_config(yaml.safe_load(f"{key}: off"), env={}), key) == "off"
    with pytest.raises(ConfigError):
        build_config({key: True}, env={})


# ---------------------------------------------------------------------- nested by component

# Every knob of the flat config as it was before it was nested, with its default (JSON form),
# under the component that now holds it. Renaming, dropping or moving a knob fails here.
LAYOUT = {
    "gate": {
        "mode": "auto",
        "threshold": 2048,
        "keep_ratio": 0.1,
        "curve": [],
    },
    "selection": {
        "select_mode": "budget_only",
        "select_chunk_size": 64,
        "select_query_tokens": 8,
        "select_query_parser": "arbitrary_tail",
        "select_top_p": 0.95,
        "select_topk": 0,
        "select_segments": "auto",
        "select_score": "auto",
        "select_scorer": "head",
        "select_split": 0.5,
        "select_position_prior": "distance",
        "select_semantic_weight": 0.5,  # auto: the embedder and the tap projection, half each
        "semantic_passage_tokens": 24,
        "select_projection_weight": 0.5,
        "select_entity_feedback": True,
        "select_passage_cuts": True,
        "select_paragraph_join": True,
        "chat_skeleton_tokens": 256,
        "system_documents": "compress",
        "system_passage_chars": 1000,
        "instruction_tags": [
            "system-reminder",
            "environment_context",
            "user_instructions",
            "INSTRUCTIONS",
            "skills_instructions",
            "permissions instructions",
            "collaboration_mode",
            "context_window_reminder",
            "tools",
        ],
        "chat_question_pin_tokens": 64,
        "chat_history_queries": 3,
        "anchor_query_tokens": 96,  # lexical evidence's tail pool reads it too
    },
    "legacy": {  # once under selection
        "legacy_chunk_size": 32,
        "legacy_query_tokens": 8,
        "legacy_pool_kernel": 13,
        "legacy_head_chunks": 8,
        "legacy_tail_chunks": 24,
        "anchor_radius": None,
        "anchor_max_hits": None,
        "repeat_min": 4,
        "repeat_max": 32,
        "legacy_repeat_rule": None,
    },
    "lexical": {
        "select_lexical": "cascade",
        "lexical_query": "question",
        "lexical_rare_max_freq": 2,
        "lexical_cascade_iters": 8,
        "lexical_max_share": 1.0,
    },
    "views": {
        "chat_view": True,
        "chat_recall": True,
        "chat_recall_min_lift": 2.0,
        "chat_compress_new_tokens": 256,
        "chat_read_ahead": True,
        "view_capacity": 1024,
        "view_ttl_s": 3600.0,
        "adaptive_keep": True,
        "adaptive_min": 0.025,
        "adaptive_max": 0.2,
        "adaptive_sessions": 1024,
    },
    "scoring": {
        "drafter": "embedded:smollm2-135m",
        "drafter_tokenizer": None,
        "drafter_profile": "auto",
        "drafter_head_layer": 8,
        "drafter_chunk_tokens": 1024,
        "drafter_sessions": 2,
        "drafter_attention": "window",
        "drafter_window_tokens": 2048,
        "drafter_sink_tokens": 64,
        "drafter_sink_positions": "adjacent",
        "drafter_block_tokens": 128,
        "drafter_top_blocks": 8,
        "device": "auto",
        "scoring_head_gguf": "embedded",
        "segment_probe_gguf": "embedded",
        "drafter_calibration": None,
        "semantic_embedder": "embedded:all-minilm-l6-v2",
        "semantic_embedder_dtype": "auto",
        "projection_gguf": "embedded",
    },
    "generation": {
        "target": "embedded:smollm2-135m",
        "target_tokenizer": None,
        "target_backend": "transformers",
        "upstream_base_url": None,
        "upstream_api_key": None,
        "upstream_model": None,
        "upstream_prompt_format": "text",
        "upstream_cache_salt": True,
        "upstream_timeout_s": 600.0,
        "ray_llm_app": "llm",
        "max_context": None,
        "speculative_tokens": 0,
        "speculative_drafter": None,
    },
    "server": {
        "on_drafter_error": "fail",
        "return_prompt_enabled": False,
        "tool_call_parser": "hermes",
        "max_body_bytes": 16777216,
        "body_read_timeout_s": 30.0,
        "served_model_names": ["pflash"],
        "max_messages": 4096,
        "max_prompt_tokens": 131072,
        "max_output_tokens": 4096,
        "request_timeout_s": 900.0,
        "remote_call_timeout_s": 600.0,
        "store_call_timeout_s": 5.0,
        "trace_path": None,
    },
    "security": {
        "api_keys": [],
        "anonymous_tenant": "local",
        "trusted_proxies": [],
        "tenant_secret": None,
    },
}


def test_config_is_nested_by_component_and_each_component_holds_its_knobs():
    assert {name: list(model.model_fields) for name, model in COMPONENTS.items()} == {
        name: list(knobs) for name, knobs in LAYOUT.items()
    }
    cfg = build_config(env={})
    for name, knobs in LAYOUT.items():
        assert getattr(cfg, name).model_dump(mode="json") == knobs
        assert {key: FIELDS[key] for key in knobs} == dict.fromkeys(knobs, name)


def test_defaults_are_unchanged():
    flat = {key: value for knobs in LAYOUT.values() for key, value in knobs.items()}
    assert build_config(env={}).model_dump(mode="json") == flat


# key, YAML value, PFLASH_* value, the value both mean (never the default)
SAMPLES = [
    ("mode", "always", "always", "always"),
    ("threshold", 100, "100", 100),
    ("keep_ratio", 0.2, "0.2", 0.2),
    ("curve", "2000:0.2 1000:0.5", "2000:0.2,1000:0.5", ((1000, 0.5), (2000, 0.2))),
    ("select_mode", "top_p", "top_p", "top_p"),
    ("select_chunk_size", 256, "256", 256),
    ("select_query_tokens", 16, "16", 16),
    ("select_query_parser", "latest_user", "latest_user", "latest_user"),
    ("select_top_p", 0.9, "0.9", 0.9),
    ("select_topk", 4, "4", 4),
    ("select_segments", "fixed", "fixed", "fixed"),
    ("select_score", "sum", "sum", "sum"),
    ("select_scorer", "split", "split", "split"),
    ("select_split", 0.25, "0.25", 0.25),
    ("select_position_prior", False, "off", "off"),
    ("select_semantic_weight", 0.25, "0.25", 0.25),
    ("semantic_passage_tokens", 32, "32", 32),
    ("select_projection_weight", 0.25, "0.25", 0.25),
    ("select_entity_feedback", False, "false", False),
    ("select_passage_cuts", False, "0", False),
    ("select_paragraph_join", False, "0", False),
    ("chat_skeleton_tokens", 128, "128", 128),
    ("system_documents", "keep", "keep", "keep"),
    ("system_passage_chars", 500, "500", 500),
    (
        "instruction_tags",
        ["system-reminder", "user query"],
        "system-reminder, user query",
        ("system-reminder", "user query"),
    ),
    ("chat_question_pin_tokens", 0, "0", 0),
    ("chat_history_queries", 1, "1", 1),
    ("anchor_query_tokens", 48, "48", 48),
    ("legacy_chunk_size", 64, "64", 64),
    ("legacy_query_tokens", 16, "16", 16),
    ("legacy_pool_kernel", 7, "7", 7),
    ("legacy_head_chunks", 2, "2", 2),
    ("legacy_tail_chunks", 4, "4", 4),
    ("anchor_radius", 3, "3", 3),
    ("anchor_max_hits", 5, "5", 5),
    ("repeat_min", 2, "2", 2),
    ("repeat_max", 8, "8", 8),
    ("legacy_repeat_rule", True, "yes", True),
    ("select_lexical", "anchors", "anchors", "anchors"),
    ("lexical_query", "tail", "tail", "tail"),
    ("lexical_rare_max_freq", 3, "3", 3),
    ("lexical_cascade_iters", 4, "4", 4),
    ("lexical_max_share", 0.5, "0.5", 0.5),
    ("chat_view", False, "0", False),
    ("chat_recall", False, "off", False),
    ("chat_recall_min_lift", 3.5, "3.5", 3.5),
    ("chat_compress_new_tokens", 4096, "4096", 4096),
    ("chat_read_ahead", False, "false", False),
    ("view_capacity", 8, "8", 8),
    ("view_ttl_s", 60, "60", 60.0),
    ("adaptive_keep", False, "no", False),
    ("adaptive_min", 0.05, "0.05", 0.05),
    ("adaptive_max", 0.5, "0.5", 0.5),
    ("adaptive_sessions", 16, "16", 16),
    ("drafter", "/models/d.gguf", "/models/d.gguf", "/models/d.gguf"),
    ("drafter_tokenizer", "/models/tok", "/models/tok", "/models/tok"),
    ("drafter_profile", "qwen3", "qwen3", "qwen3"),
    ("drafter_head_layer", 17, "17", 17),
    ("drafter_chunk_tokens", 256, "256", 256),
    ("drafter_sessions", 0, "0", 0),
    ("drafter_attention", "block_sparse", "block_sparse", "block_sparse"),
    ("drafter_window_tokens", 4096, "4096", 4096),
    ("drafter_sink_tokens", 0, "0", 0),
    ("drafter_sink_positions", "absolute", "absolute", "absolute"),
    ("drafter_block_tokens", 64, "64", 64),
    ("drafter_top_blocks", 4, "4", 4),
    ("device", "cpu", "cpu", "cpu"),
    ("scoring_head_gguf", "/models/h.gguf", "/models/h.gguf", "/models/h.gguf"),
    ("segment_probe_gguf", "/models/p.gguf", "/models/p.gguf", "/models/p.gguf"),
    ("drafter_calibration", "embedded", "embedded", "embedded"),
    ("semantic_embedder", "/models/minilm", "/models/minilm", "/models/minilm"),
    ("semantic_embedder_dtype", "float32", "float32", "float32"),
    ("projection_gguf", "/models/p.gguf", "/models/p.gguf", "/models/p.gguf"),
    ("target", "/models/t", "/models/t", "/models/t"),
    ("target_tokenizer", "/models/tt", "/models/tt", "/models/tt"),
    ("target_backend", "openai", "openai", "openai"),
    ("upstream_base_url", "http://u:8001/v1", "http://u:8001/v1", "http://u:8001/v1"),
    ("upstream_api_key", "sk-x", "sk-x", "sk-x"),
    ("upstream_model", "m", "m", "m"),
    ("upstream_prompt_format", "token_ids", "token_ids", "token_ids"),
    ("upstream_cache_salt", False, "0", False),
    ("upstream_timeout_s", 30.0, "30", 30.0),
    ("ray_llm_app", "vllm", "vllm", "vllm"),
    ("max_context", 4096, "4096", 4096),
    ("speculative_tokens", 4, "4", 4),
    ("speculative_drafter", "/models/s", "/models/s", "/models/s"),
    ("on_drafter_error", "bypass", "bypass", "bypass"),
    ("return_prompt_enabled", True, "true", True),
    ("tool_call_parser", "none", "none", "none"),
    ("max_body_bytes", 2048, "2048", 2048),
    ("body_read_timeout_s", 2.5, "2.5", 2.5),
    ("served_model_names", ["a", "b"], "a,b", ("a", "b")),
    ("max_messages", 10, "10", 10),
    ("max_prompt_tokens", 1000, "1000", 1000),
    ("max_output_tokens", 64, "64", 64),
    ("request_timeout_s", 30.0, "30", 30.0),
    ("remote_call_timeout_s", 60.0, "60", 60.0),
    ("store_call_timeout_s", 1.5, "1.5", 1.5),
    ("trace_path", "/tmp/t.jsonl", "/tmp/t.jsonl", "/tmp/t.jsonl"),
    ("api_keys", ["key-one-1", "key-two-2"], "key-one-1, key-two-2", ("key-one-1", "key-two-2")),
    ("anonymous_tenant", "per_address", "per_address", "per_address"),
    ("trusted_proxies", ["10.0.0.0/8", "::1"], "10.0.0.0/8 ::1", ("10.0.0.0/8", "::1")),
    ("tenant_secret", "a-server-secret", "a-server-secret", "a-server-secret"),
]
NEEDS = {  # the cross-field checks
    "target_backend": {"upstream_base_url": "http://u:8001/v1"},
    "select_projection_weight": {"select_semantic_weight": 0.0},
}


def test_samples_cover_every_knob():
    assert [s[0] for s in SAMPLES] == [key for knobs in LAYOUT.values() for key in knobs]


@pytest.mark.parametrize(("key", "yaml_value", "env_value", "expected"), SAMPLES)
def test_flat_key_nested_key_and_env_name_mean_the_same(key, yaml_value, env_value, expected):
    component, needs = FIELDS[key], NEEDS.get(key, {})
    flat = build_config({key: yaml_value, **needs}, env={})
    nested = build_config({component: {key: yaml_value}, **needs}, env={})
    from_env = build_config(needs, env={f"PFLASH_{key.upper()}": env_value})
    assert getattr(flat, key) == getattr(getattr(flat, component), key) == expected
    assert flat == nested == from_env
    assert expected != LAYOUT[component][key]


# the five defaults that changed when the library took the embedded app's tuning
BEFORE_DEFAULTS = {
    "keep_ratio": 0.05,
    "select_chunk_size": None,
    "drafter_head_layer": None,
    "scoring_head_gguf": None,
    "segment_probe_gguf": None,
}


# a drafter no projection ships for: the embedder alone, as before the projection
NO_SHIPPED_PROJECTION = {
    "select_semantic_weight": 1.0,
    "select_projection_weight": 0.0,
    "projection_gguf": None,
}


def shipped_args(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    if doc.get("kind") == "RayService":
        doc = yaml.safe_load(doc["spec"]["serveConfigV2"])
    (app,) = [a for a in doc["applications"] if a["import_path"] == "deployments.app:build_app"]
    return app["args"]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "serve_config.yaml",
            {
                "keep_ratio": 0.1,
                "select_chunk_size": 64,
                "drafter_head_layer": 8,
                "scoring_head_gguf": "embedded",
                "segment_probe_gguf": "embedded",
                # set since: the embedded target runs with 32K so agent clients' harness fits
                "max_context": 32768,
            },
        ),
        (
            "examples/serve_config.gpu.yaml",
            {
                "threshold": 16384,
                "curve": [[16000, 0.2], [64000, 0.1], [128000, 0.05]],
                "drafter": "/models/qwen3-0.6b/Qwen3-0.6B-Q8_0.gguf",
                **NO_SHIPPED_PROJECTION,
                "target": "/models/qwen3-32b",
                "target_backend": "openai",
                "upstream_base_url": "http://127.0.0.1:8001/v1",
                "upstream_model": "Qwen/Qwen3-32B",
                "device": "cuda",
                "max_context": 131072,
                "remote_call_timeout_s": 60.0,
            },
        ),
        (
            "k8s/rayservice.yaml",
            {
                "threshold": 8192,
                "keep_ratio": 0.1,
                "drafter": "/models/qwen3-0.6b/Qwen3-0.6B-Q8_0.gguf",
                **NO_SHIPPED_PROJECTION,
                "target": "/models/qwen3-8b",
            },
        ),
    ],
)
def test_shipped_args_build_the_config_they_built_before_nesting(path, expected):
    """The effective config of the Serve configs shipped before the nesting and before the
    product defaults became the embedded tuning: every value, recorded from the
    flat PFlashConfig as the old defaults plus what each file set. keep_ratio is not read
    when a curve is set."""
    cfg = build_config(shipped_args(ROOT / path), env={})
    before = {key: value for knobs in LAYOUT.values() for key, value in knobs.items()}
    before |= BEFORE_DEFAULTS | expected
    got = cfg.model_dump(mode="json")
    if got["curve"]:
        got.pop("keep_ratio"), before.pop("keep_ratio")
    assert got == before


@pytest.mark.parametrize(
    "path",
    [ROOT / "serve_config.yaml", ROOT / "k8s" / "rayservice.yaml"]
    + sorted((ROOT / "examples").glob("*.yaml")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_shipped_args_build_the_same_config_flat_or_nested(path):
    args = shipped_args(path)
    nested: dict = {}
    for key, value in args.items():
        nested.setdefault(FIELDS[key], {})[key] = value
    assert build_config(nested, env={}) == build_config(args, env={})


def test_flat_dump_round_trips():
    cfg = build_config(
        {
            "gate": {"curve": "1000:0.5"},
            "select_mode": "top_k",
            "select_topk": 3,
            "api_keys": ["key-one-1"],
        },
        env={},
    )
    dump = cfg.model_dump()
    assert set(dump) == set(FIELDS)
    assert build_config(dump, env={}) == cfg
    assert build_config(cfg.model_dump(mode="json"), env={}) == cfg
    small = cfg.model_dump(mode="json", exclude_defaults=True)
    assert small == {
        "curve": [[1000, 0.5]],
        "select_mode": "top_k",
        "select_topk": 3,
        "api_keys": ["key-one-1"],
        # `auto` scoring settings are resolved for the embedded drafter, so they differ
        "drafter_head_layer": 8,
        "scoring_head_gguf": "embedded",
        "segment_probe_gguf": "embedded",
        "projection_gguf": "embedded",
        "select_semantic_weight": 0.5,
        "select_projection_weight": 0.5,
    }
    assert build_config(small, env={}) == cfg
    rebuilt = build_config({**cfg.model_dump(), "select_topk": 5}, env={})
    assert (rebuilt.select_topk, rebuilt.curve) == (5, ((1000, 0.5),))


def test_flat_reads_are_read_only():
    cfg = build_config(env={})
    with pytest.raises(ValueError):
        cfg.keep_ratio = 0.5
    assert PFlashConfig.keep_ratio.__doc__.startswith("`gate.keep_ratio`: Configured keep ratio")


def test_environment_overrides_nested_yaml(tmp_path):
    path = tmp_path / "pflash.yaml"
    path.write_text("gate:\n  keep_ratio: 0.2\n  mode: off\nselection: {select_mode: top_p}\n")
    cfg = load_config(path, env={"PFLASH_KEEP_RATIO": "0.3"})
    assert (cfg.keep_ratio, cfg.mode, cfg.select_mode) == (0.3, "off", "top_p")
    flat_then_nested = build_config({"keep_ratio": 0.1, "gate": {"keep_ratio": 0.2}}, env={})
    assert flat_then_nested.keep_ratio == 0.2  # the later key wins, as in a dict merge


def test_live_update_over_a_flat_base_applies_flat_or_nested_keys():
    base = build_config({"keep_ratio": 0.1, "select_top_p": 0.8}, env={}).model_dump()
    assert build_config({**base, "gate": {"keep_ratio": 0.3}}, env={}).keep_ratio == 0.3
    assert build_config({**base, "keep_ratio": 0.3}, env={}).keep_ratio == 0.3
    assert build_config({**base, "gate": {"mode": "always"}}, env={}).keep_ratio == 0.1


@pytest.mark.parametrize(
    ("data", "key", "hint"),
    [
        ({"keep_ration": 0.1}, "keep_ration", "keep_ratio"),
        ({"selections": {"select_mode": "top_k"}}, "selections", "selection"),
        ({"selection": {"select_moed": "top_k"}}, "selection.select_moed", "select_mode"),
        ({"selection": {"keep_ratio": 0.1}}, "selection.keep_ratio", "belongs to gate"),
        ({"gate": 0.1}, "gate", "dictionary"),
    ],
)
def test_unknown_flat_and_nested_keys_fail_naming_the_key(data, key, hint):
    with pytest.raises(ConfigError) as err:
        build_config(data, env={})
    assert err.value.key == key
    assert hint in err.value.allowed


def test_legacy_keys_load_under_selection_where_they_were_before_their_own_component():
    """The legacy selector's keys moved from `selection` to `legacy`: a config that nests
    them under selection means what it meant, and so does one that nests them under legacy."""
    old = build_config({"selection": {"select_mode": "legacy", "legacy_chunk_size": 64}}, env={})
    new = build_config({"selection": {"select_mode": "legacy"}, "legacy": {"legacy_chunk_size": 64}}, env={})  # fmt: skip
    flat = build_config({"select_mode": "legacy", "legacy_chunk_size": 64}, env={})
    assert old == new == flat
    assert (old.legacy.legacy_chunk_size, old.legacy_chunk_size, old.strict) == (64, 64, False)
    later = build_config({"legacy_chunk_size": 16, "selection": {"legacy_chunk_size": 64}}, env={})
    assert later.legacy_chunk_size == 64  # the later key wins, as for any nested key
    with pytest.raises(ConfigError) as err:
        build_config({"selection": {"repeat_min": 0}}, env={})
    assert (err.value.key, err.value.value) == ("repeat_min", 0)
    with pytest.raises(ConfigError) as err:  # only under the component it moved from
        build_config({"gate": {"legacy_chunk_size": 64}}, env={})
    assert "belongs to legacy" in err.value.allowed


def test_nested_errors_name_the_flat_key_value_and_allowed():
    with pytest.raises(ConfigError) as err:
        build_config({"gate": {"keep_ratio": 2}}, env={})
    assert (err.value.key, err.value.value) == ("keep_ratio", 2)
    with pytest.raises(ConfigError) as err:
        build_config({"selection": {"select_mode": "top_k"}}, env={})
    assert (err.value.key, err.value.value) == ("select_topk", 0)
    with pytest.raises(ConfigError) as err:
        build_config({"gate": {"mode": "sometimes"}}, env={})
    assert err.value.key == "mode" and "off, auto, always" in err.value.allowed


# ---------------------------------------------------------------------- parts


def test_a_part_holds_only_its_components_and_reads_their_knobs_flat():
    cfg = build_config({"keep_ratio": 0.2, "drafter_sessions": 0, "max_context": 4096}, env={})
    drafter = cfg.part(DrafterScorerPart)
    assert set(DrafterScorerPart.model_fields) == {"scoring", "selection", "legacy"}
    assert (drafter.scoring, drafter.selection) == (cfg.scoring, cfg.selection)
    assert drafter.legacy is cfg.legacy and drafter.legacy_pool_kernel == 13  # not rebuilt
    assert drafter.drafter_sessions == 0 and drafter.select_mode == "budget_only"
    with pytest.raises(AttributeError):
        drafter.keep_ratio  # noqa: B018
    target = cfg.part(TargetModelPart)
    assert set(TargetModelPart.model_fields) == {"generation", "scoring"}
    assert (target.max_context, target.device, target.drafter) == (4096, "auto", cfg.drafter)
    assert cfg.part(ViewsConfig) is cfg.views and cfg.part(ScoringConfig) is cfg.scoring
    assert set(drafter.model_dump()) == set(cfg.scoring.model_dump()) | set(
        cfg.selection.model_dump()
    ) | set(cfg.legacy.model_dump())


def test_a_part_extending_another_reads_its_knobs_flat_and_cannot_move_one():
    """The view decision's part is the compression's plus the views: it is handed on to the
    compression as is, and a subclass that put a knob under another component is refused."""
    from pflash.config import ComponentSet, CompressionPart, ViewPart
    from pflash.config.components import LexicalConfig, SelectionConfig

    cfg = build_config({"keep_ratio": 0.2, "chat_view": False}, env={})
    view = cfg.part(ViewPart)
    assert set(ViewPart.model_fields) == set(CompressionPart.model_fields) | {"views"}
    assert (view.keep_ratio, view.chat_view, view.select_mode) == (0.2, False, "budget_only")
    assert view.part(CompressionPart) is view
    assert view.model_dump() == {**cfg.part(CompressionPart).model_dump(), **cfg.views.model_dump()}
    with pytest.raises(TypeError, match="not unique"):

        class Moved(CompressionPart):  # selection's knobs again, under another name
            other: SelectionConfig

    with pytest.raises(TypeError, match="not unique"):

        class Twice(ComponentSet):
            lexical: LexicalConfig
            more: LexicalConfig


def test_a_part_is_rebuilt_from_its_keys_and_a_live_update_of_any_knob():
    cfg = build_config(
        {"drafter_head_layer": 17, "select_chunk_size": 32, "keep_ratio": 0.2}, env={}
    )
    args = cfg.part(DrafterScorerPart).model_dump(mode="json", exclude_defaults=True)
    assert args == {
        "drafter_head_layer": 17,
        "select_chunk_size": 32,
        "scoring_head_gguf": "embedded",  # auto, resolved for the embedded drafter
        "segment_probe_gguf": "embedded",
        "projection_gguf": "embedded",
        "select_semantic_weight": 1.0,  # no projection ships for layer 17: the embedder alone
        "select_projection_weight": 0.0,
    }
    assert build_part(DrafterScorerPart, args, env={}) == cfg.part(DrafterScorerPart)
    live = build_part(DrafterScorerPart, {**args, "keep_ratio": 0.3, "select_top_p": 0.5}, env={})
    assert (live.select_top_p, live.drafter_head_layer) == (0.5, 17)
    env = build_part(DrafterScorerPart, args, env={"PFLASH_DRAFTER_SESSIONS": "0"})
    assert env.drafter_sessions == 0
    with pytest.raises(ConfigError) as err:
        build_part(DrafterScorerPart, {**args, "keep_ration": 0.3}, env={})
    assert err.value.key == "keep_ration"


def test_build_app_gives_each_deployment_only_its_part(monkeypatch):
    """The Ingress runs the whole flow (whole config); the others get their components."""
    from deployments import app as app_module

    bound: dict[str, tuple] = {}

    class Recorder:
        def __init__(self, name: str):
            self.name = name

        def bind(self, *args):
            bound[self.name] = args
            return self.name

        def options(self, *, deployment_actors):
            (store,) = deployment_actors
            bound["SessionStore"] = (store.init_kwargs["config"],)
            return self

    for name in ("DrafterScorerDeployment", "SegmentProbeDeployment", "TargetModelDeployment"):
        monkeypatch.setattr(app_module, name, Recorder(name))
    monkeypatch.setattr(app_module, "Ingress", Recorder("Ingress"))
    (app,) = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"]
    args = {**app["args"], "view_capacity": 8, "api_keys": ["key-one-1"], "max_context": 4096}
    for name in [name for name in os.environ if name.startswith("PFLASH_")]:
        monkeypatch.delenv(name)
    app_module.build_app(args)
    cfg = build_config(args, env={})
    scoring = {
        "drafter_head_layer": 8,
        "scoring_head_gguf": "embedded",
        "segment_probe_gguf": "embedded",
        "projection_gguf": "embedded",
    }
    weights = {"select_semantic_weight": 0.5, "select_projection_weight": 0.5}  # selection's
    assert bound["DrafterScorerDeployment"] == (scoring | weights,)
    assert bound["SegmentProbeDeployment"] == (scoring,)
    assert bound["TargetModelDeployment"] == ({"max_context": 4096, **scoring},)
    assert bound["SessionStore"] == ({"view_capacity": 8},)
    data, drafter, target, probe = bound["Ingress"]
    assert data == cfg.model_dump(mode="json", exclude_defaults=True)
    assert (drafter, target, probe) == (
        "DrafterScorerDeployment",
        "TargetModelDeployment",
        "SegmentProbeDeployment",
    )


@pytest.mark.parametrize("keys", [[""], ["   "], ["short"], ["a-good-key-1", ""]])
def test_empty_or_short_api_keys_are_refused_at_load(keys):
    """`api_keys: [""]` once turned authentication off silently."""
    with pytest.raises(ConfigError) as err:
        build_config({"api_keys": keys}, env={})
    assert err.value.key == "api_keys" and "at least 8" in str(err.value)


SECRET = "sk-live-0123456789abcdef"


@pytest.mark.parametrize(
    "data",
    [
        {"api_keys": [SECRET, "short"]},
        {"api_keys": [SECRET, f" {SECRET} "]},
        {"api_keys": SECRET},  # a string, not a list
        {"api_keys": [SECRET, 12345678]},  # an element of the wrong type
        {"security": {"api_keys": [SECRET, ""]}},
        {"tenant_secret": SECRET[:3]},
        {"tenant_secret": 12345, "api_keys": [SECRET]},
        {"upstream_api_key": 12345, "api_keys": [SECRET]},
        {"api_key": SECRET},  # a misspelt secret is an unknown key
        {"security": {"api_key": SECRET}},
    ],
)
def test_no_config_error_shows_a_secret(data):
    """`invalid config api_keys=['sk-live-…', 'short']` once went to `serve status`."""
    with pytest.raises(ConfigError) as err:
        build_config(data, env={})
    for text in (str(err.value), repr(err.value.value), err.value.message):
        assert SECRET not in text and SECRET[:8] not in text and "12345" not in text
    assert "<redacted>" in str(err.value)


def test_a_secret_from_the_environment_is_not_shown_either():
    with pytest.raises(ConfigError) as err:
        build_config(env={"PFLASH_API_KEYS": f"{SECRET} short"})
    assert err.value.key == "api_keys" and SECRET[:8] not in str(err.value)


def test_the_config_repr_shows_no_secret():
    cfg = build_config(
        {"api_keys": [SECRET], "upstream_api_key": SECRET + "-up", "tenant_secret": SECRET + "-t"},
        env={},
    )
    for text in (repr(cfg), str(cfg), repr(cfg.security), repr(cfg.generation)):
        assert SECRET[:8] not in text
    assert SECRETS == {"api_keys", "upstream_api_key", "tenant_secret"}


def test_a_key_with_surrounding_whitespace_is_refused_without_showing_it():
    """A Bearer token is stripped, so such a key could never authenticate."""
    with pytest.raises(ConfigError) as err:
        build_config({"api_keys": ["a-good-key-1", "a-good-key-2\n"]}, env={})
    assert err.value.key == "api_keys" and "key #2" in str(err.value)
    assert "whitespace" in str(err.value) and "a-good-key" not in str(err.value)


@pytest.mark.parametrize("net", ["10.0.0.0/33", "proxy.example", "", "10.0.0.1/8/8"])
def test_a_trusted_proxy_that_is_no_network_is_refused(net):
    with pytest.raises(ConfigError) as err:
        build_config({"trusted_proxies": [net]}, env={})
    assert err.value.key == "trusted_proxies" and "CIDR" in str(err.value)


def test_an_unknown_anonymous_policy_names_the_choices():
    with pytest.raises(ConfigError) as err:
        build_config({"anonymous_tenant": "open"}, env={})
    assert "local, per_address, shared, refuse" in str(err.value)


# ------------------------------------------------------------------------ evidence weights

QWEN_DRAFTER = "/models/qwen3-0.6b/Qwen3-0.6B-Q8_0.gguf"


@pytest.mark.parametrize(
    ("data", "semantic", "projection"),
    [
        ({}, 0.5, 0.5),  # the embedded drafter at layer 8: the shipped projection fits
        ({"drafter_head_layer": 17}, 1.0, 0.0),  # no projection ships for layer 17
        ({"select_mode": "legacy"}, 1.0, 0.0),  # no layer-8 tap without strict selection
        ({"drafter_calibration": "embedded"}, 1.0, 0.0),  # a calibration picks the layer
        ({"drafter": QWEN_DRAFTER}, 1.0, 0.0),
        ({"select_semantic_weight": 1.0}, 1.0, 0.0),  # a set embedder weight keeps auto off
        ({"select_semantic_weight": 0.0}, 0.0, 0.0),  # attention alone, as before
        ({"select_projection_weight": 0.8}, 0.2, 0.8),  # the embedder gets the rest
        ({"select_projection_weight": 1.0}, 0.0, 1.0),
    ],
)
def test_auto_evidence_weights_mix_embedder_and_projection_only_where_one_ships(
    data, semantic, projection
):
    cfg = build_config(data, env={})
    assert (cfg.select_semantic_weight, cfg.select_projection_weight) == (semantic, projection)
    assert cfg.projection_gguf == (None if "drafter" in data else "embedded")


def test_auto_weights_are_written_out_resolved_and_rebuild_the_same_config():
    cfg = build_config({"drafter_head_layer": 17}, env={})
    small = cfg.model_dump(mode="json", exclude_defaults=True)
    assert (small["select_semantic_weight"], small["select_projection_weight"]) == (1.0, 0.0)
    assert build_config(small, env={}) == cfg
    from_env = build_config(env={"PFLASH_SELECT_PROJECTION_WEIGHT": "auto"})
    assert from_env == build_config(env={})


def test_projection_evidence_without_a_projection_for_the_drafter_fails_at_load():
    with pytest.raises(ConfigError) as err:
        build_config({"drafter": QWEN_DRAFTER, "select_projection_weight": 0.5}, env={})
    assert err.value.key == "projection_gguf" and "pflash projection train" in str(err.value)
    with pytest.raises(ConfigError) as err:
        build_config({"drafter": QWEN_DRAFTER, "projection_gguf": "embedded"}, env={})
    assert err.value.key == "projection_gguf" and "embedded:smollm2-135m" in str(err.value)
    given = build_config(
        {"drafter": QWEN_DRAFTER, "projection_gguf": "/p.gguf", "select_projection_weight": 0.5},
        env={},
    )
    assert (given.select_semantic_weight, given.select_projection_weight) == (0.5, 0.5)


def test_a_weight_that_is_neither_a_number_in_range_nor_auto_names_both():
    with pytest.raises(ConfigError) as err:
        build_config({"select_semantic_weight": 1.5}, env={})
    assert err.value.key == "select_semantic_weight"
    assert "less than or equal to 1" in str(err.value) and "auto" in str(err.value)


def test_every_config_field_is_read_by_product_code():
    """A knob nothing reads is a promise the server does not keep: each flat key is read as an
    attribute (`config.key`, `part.key`) or by name somewhere in pflash/ or deployments/
    outside the config package itself."""
    files = [
        *(ROOT / "pflash").rglob("*.py"),
        *(ROOT / "deployments").rglob("*.py"),
    ]
    code = "\n".join(
        p.read_text(encoding="utf-8")
        for p in files
        if (ROOT / "pflash" / "config") not in p.parents
    )
    unread = [
        key
        for key in FIELDS
        if not re.search(rf"\.{re.escape(key)}\b|[\"']{re.escape(key)}[\"']", code)
    ]
    assert unread == []
