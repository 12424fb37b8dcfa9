"""A key the server no longer reads fails the config with what to use instead, from YAML,
a component mapping or the environment; it is never silently ignored."""

from __future__ import annotations

import pytest

from pflash.config import build_config
from pflash.errors import ConfigError


@pytest.mark.parametrize(
    "data,env",
    [
        ({"view_trace_path": "/tmp/v.jsonl"}, {}),
        ({"server": {"view_trace_path": "/tmp/v.jsonl"}}, {}),
        ({}, {"PFLASH_VIEW_TRACE_PATH": "/tmp/v.jsonl"}),
    ],
)
def test_view_trace_path_was_removed_and_says_to_use_trace_path(data, env):
    with pytest.raises(ConfigError) as err:
        build_config(data, env=env)
    assert "view_trace_path was removed" in str(err.value)
    assert "use trace_path" in str(err.value)


LOST_MECHANISMS = {
    # key: (a value a config may still set, what the error says to do instead)
    "select_likelihood_weight": (0.5, "select_semantic_weight"),
    "likelihood_passage_tokens": (96, "semantic_passage_tokens"),
    "drafter_lookahead_tokens": (8, "delete the key"),
    "drafter_lookahead_weight": (1.0, "delete the key"),
    "assembly_cut_marker": (True, "select_paragraph_join"),
}


@pytest.mark.parametrize("key", sorted(LOST_MECHANISMS))
@pytest.mark.parametrize("where", ["flat", "component", "env"])
def test_a_mechanism_that_lost_its_measurements_fails_naming_what_to_do(key, where):
    """Question likelihood, look-ahead drafts and cut markers left the product config (their
    measurements are in docs/BENCHMARK_NOTEBOOK.md): a config that still sets them fails at
    startup with the replacement, from every place a key can be written."""
    from pflash.config import FIELDS

    assert key not in FIELDS
    value, instead = LOST_MECHANISMS[key]
    component = "scoring" if key.startswith("drafter_") else "selection"
    data, env = {
        "flat": ({key: value}, {}),
        "component": ({component: {key: value}}, {}),
        "env": ({}, {f"PFLASH_{key.upper()}": str(value)}),
    }[where]
    with pytest.raises(ConfigError) as err:
        build_config(data, env=env)
    assert f"{key} was removed" in str(err.value) and instead in str(err.value)
