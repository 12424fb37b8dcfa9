"""PFlashConfig: defaults, precedence, and error messages that name key, value and allowed."""

from __future__ import annotations

import pytest

from pflash.config import PFlashConfig, build_config, config_table, load_config
from pflash.errors import ConfigError


def test_product_defaults_are_strict_selection_with_auto_mode():
    cfg = build_config(env={})
    assert cfg.select_mode == "budget_only"
    assert cfg.strict is True
    assert cfg.select_scorer == "head"
    assert cfg.select_query_parser == "arbitrary_tail"
    assert cfg.mode == "auto"
    assert cfg.keep_ratio == 0.05
    assert cfg.select_top_p == 0.95
    assert cfg.select_query_tokens == 8
    assert cfg.chat_view is True and cfg.chat_recall is True
    assert cfg.chat_recall_min_lift == 2.0
    assert cfg.chat_compress_new_tokens == 16384
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


def test_request_overrides_replace_mode_and_keep_ratio_only():
    base = build_config({"curve": "1000:0.5 2000:0.2"}, env={})
    cfg = base.with_request_overrides(mode="always", keep_ratio=0.25)
    assert cfg.mode == "always" and cfg.keep_ratio == 0.25 and cfg.curve == ()
    assert base.mode == "auto"
    with pytest.raises(ConfigError):
        base.with_request_overrides(keep_ratio=0.0)


def test_config_table_documents_every_field():
    table = config_table()
    for name in PFlashConfig.model_fields:
        assert f"`{name}`" in table
        assert f"`PFLASH_{name.upper()}`" in table


def test_readme_config_table_matches_the_config():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    begin = readme.index("<!-- config-table:begin -->") + len("<!-- config-table:begin -->")
    end = readme.index("<!-- config-table:end -->")
    assert readme[begin:end].strip() == config_table().strip(), (
        "README config table is stale: regenerate it from pflash.config.config_table()"
    )


@pytest.mark.parametrize("key", ["mode", "select_lexical", "select_position_prior"])
def test_bare_yaml_off_means_off(key):
    import yaml

    assert getattr(build_config(yaml.safe_load(f"{key}: off"), env={}), key) == "off"
    with pytest.raises(ConfigError):
        build_config({key: True}, env={})
