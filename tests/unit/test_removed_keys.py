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
