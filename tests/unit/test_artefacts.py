"""Drafter-bound files (`pflash.config.artefacts`): one table says what ships for the embedded
drafter and at which tap, one resolver turns every config value into a file the same way,
and every kind refuses a file or an `embedded` that belongs to another drafter, naming its
key and what differs. Each row runs on the files shipped in pflash/data; no model loads."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import pflash.config.artefacts as artefacts
from pflash.config import build_config
from pflash.config.artefacts import ARTEFACTS, DATA_DIR, layer_tap, resolve_artefact
from pflash.config.components import EMBEDDED_PROJECTION_LAYERS, EMBEDDED_SHIPPED_LAYERS
from pflash.errors import ConfigError, ModelUnavailable
from pflash.models.drafter.calibration import load_calibration
from pflash.models.drafter.scoring_head import HeadIdentity, load_scoring_head
from pflash.models.gguf_io import read_scoring_head_gguf
from pflash.models.probe import ProbeIdentity, load_segment_probe, read_probe_gguf
from pflash.models.projection import load_tap_projection, read_projection_gguf

EMBEDDED = "embedded:smollm2-135m"
OTHER_DRAFTER = "/models/qwen3-0.6b.gguf"
OTHER_SHA = "ab" * 32
KINDS = ("head", "probe", "projection", "calibration")

# kind -> (default shipped file, {scoring layer: the file `embedded` is at that layer's tap})
SHIPPED = {
    "head": (
        "smollm2_135m_scoring_head.gguf",
        {17: "smollm2_135m_scoring_head.gguf", 8: "smollm2_135m_scoring_head_l8.gguf"},
    ),
    "probe": (
        "smollm2_135m_segment_probe.gguf",
        {17: "smollm2_135m_segment_probe.gguf", 8: "smollm2_135m_segment_probe_l8.gguf"},
    ),
    "projection": (
        "smollm2_135m_tap_projection_l8.gguf",
        {8: "smollm2_135m_tap_projection_l8.gguf"},
    ),
    "calibration": ("smollm2_135m_calibration.json", {}),
}


def test_every_kind_has_one_row_naming_its_config_key():
    assert {k: a.field for k, a in ARTEFACTS.items()} == {
        "head": "scoring_head_gguf",
        "probe": "segment_probe_gguf",
        "projection": "projection_gguf",
        "calibration": "drafter_calibration",
    }


@pytest.mark.parametrize("kind", KINDS)
def test_embedded_is_the_shipped_file_reading_the_scoring_layers_tap(kind):
    default, by_layer = SHIPPED[kind]
    assert resolve_artefact(kind, "embedded", EMBEDDED) == DATA_DIR / default
    for layer, name in by_layer.items():
        assert resolve_artefact(kind, "embedded", EMBEDDED, layer_tap(layer)) == DATA_DIR / name
    # no shipped file reads layer 5: the default, whose tap check at load names the mismatch
    assert resolve_artefact(kind, "embedded", EMBEDDED, layer_tap(5)) == DATA_DIR / default


def shipped_tap(kind: str, path: Path) -> str | None:
    """The tap a shipped file states it reads, read by its own format's reader."""
    if kind == "head":
        return read_scoring_head_gguf(path).feature_tap
    if kind == "probe":
        return read_probe_gguf(path).feature_tap
    if kind == "projection":
        return read_projection_gguf(path).feature_tap
    assert json.loads(path.read_text())["drafter"] == EMBEDDED  # a calibration binds no tap
    return None


@pytest.mark.parametrize("kind", KINDS)
def test_each_shipped_file_reads_the_tap_the_table_names(kind):
    files = ARTEFACTS[kind].shipped[EMBEDDED]
    assert {f.name: shipped_tap(kind, DATA_DIR / f.name) for f in files} == {
        f.name: f.tap for f in files
    }


def test_the_table_ships_the_layers_config_resolves_auto_for():
    layers = {k: {f.layer for f in a.shipped[EMBEDDED]} for k, a in ARTEFACTS.items()}
    assert layers["head"] == layers["probe"] == set(EMBEDDED_SHIPPED_LAYERS) - {None}
    assert layers["projection"] == set(EMBEDDED_PROJECTION_LAYERS)


@pytest.mark.parametrize("kind", KINDS)
def test_unset_is_no_file(kind):
    assert resolve_artefact(kind, None, EMBEDDED) is None
    assert resolve_artefact(kind, "", OTHER_DRAFTER) is None


@pytest.mark.parametrize("kind", KINDS)
def test_a_path_is_a_path_with_home_expanded(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "mine").write_bytes(b"x")
    assert resolve_artefact(kind, "~/mine", OTHER_DRAFTER) == tmp_path / "mine"
    assert resolve_artefact(kind, tmp_path / "mine", EMBEDDED) == tmp_path / "mine"


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_file_is_refused_naming_the_key_and_how_to_write_one(kind, tmp_path):
    a = ARTEFACTS[kind]
    with pytest.raises(ModelUnavailable) as err:
        resolve_artefact(kind, str(tmp_path / "absent"), EMBEDDED)
    assert str(err.value) == (
        f"{a.noun} {tmp_path / 'absent'} not found; set {a.field} to an existing file "
        f"(`{a.train}` writes one) or unset it"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_embedded_for_another_drafter_is_refused_at_config_and_at_resolve(kind):
    a = ARTEFACTS[kind]
    why = (
        f"'embedded' is the {a.short} for {EMBEDDED}; for drafter {OTHER_DRAFTER!r} "
        f"write one with `{a.train}` and give its path"
    )
    with pytest.raises(ConfigError) as err:
        build_config({"drafter": OTHER_DRAFTER, a.field: "embedded"}, env={})
    assert (err.value.key, str(err.value)) == (
        a.field,
        f"invalid config {a.field}='embedded': {why}",
    )
    with pytest.raises(ConfigError) as err:
        resolve_artefact(kind, "embedded", OTHER_DRAFTER)
    assert (err.value.key, str(err.value)) == (
        a.field,
        f"invalid config {a.field}='embedded': {why}",
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_shipped_file_missing_from_the_installation_says_how_to_rebuild_it(
    kind, tmp_path, monkeypatch
):
    monkeypatch.setattr(artefacts, "DATA_DIR", tmp_path)
    a = ARTEFACTS[kind]
    first = a.shipped[EMBEDDED][0]
    layer = "" if first.layer is None else f" --layer {first.layer}"
    with pytest.raises(ModelUnavailable) as err:
        resolve_artefact(kind, "embedded", EMBEDDED)
    path = tmp_path / first.name
    assert str(err.value) == (
        f"{a.field} 'embedded': the shipped {a.noun} {path} is missing from this "
        f"installation; reinstall pflash, run `{a.train} --drafter {EMBEDDED}{layer} "
        f"--out {path}`, or unset {a.field}"
    )


def load_as_if(kind: str, path: Path, **change):
    """Load a shipped file for a drafter that matches it except in `change`
    (`runtime_gguf_sha256`, `feature_tap`), with the kind's own loader."""
    if kind == "head":
        f = read_scoring_head_gguf(path)
        ident = HeadIdentity(f.schema, f.base_model, f.feature_tap, f.runtime_gguf_sha256)
        return load_scoring_head(
            path,
            dataclasses.replace(ident, **change),
            q_shape=f.attn_q.shape,
            k_shape=f.attn_k.shape,
        )
    if kind == "probe":
        f = read_probe_gguf(path)
        family = f.schema.rpartition("_segment_probe_")[0]
        ident = ProbeIdentity(family, f.base_model, f.feature_tap, f.runtime_gguf_sha256, f.n_embd)
        return load_segment_probe(path, dataclasses.replace(ident, **change))
    if kind == "projection":
        f = read_projection_gguf(path)
        ident = ProbeIdentity(
            f.family, f.base_model, f.feature_tap, f.runtime_gguf_sha256, f.n_embd
        )
        return load_tap_projection(path, dataclasses.replace(ident, **change))
    sha = json.loads(path.read_text())["drafter_sha256"]
    return load_calibration(path, change.get("runtime_gguf_sha256", sha), 30, 9)


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_for_another_drafter_is_refused_naming_what_differs(kind):
    path = resolve_artefact(kind, "embedded", EMBEDDED)
    assert load_as_if(kind, path) is not None  # the shipped file fits its own drafter
    with pytest.raises((ModelUnavailable, ConfigError)) as err:
        load_as_if(kind, path, runtime_gguf_sha256=OTHER_SHA)
    message = str(err.value)
    if kind == "calibration":
        assert err.value.key == "drafter_calibration"
        assert "field 'drafter_sha256' is " in message and "another drafter file" in message
    else:
        a = ARTEFACTS[kind]
        assert message.startswith(f"{a.noun} {path} does not fit this drafter: ")
        assert "runtime_gguf_sha256 is " in message and f"expected {OTHER_SHA!r}" in message
        assert message.endswith(f"; the {a.short} was trained for a different drafter file")


@pytest.mark.parametrize("kind", ("head", "probe", "projection"))
def test_a_file_for_another_scoring_layer_is_refused_naming_drafter_head_layer(kind):
    path = resolve_artefact(kind, "embedded", EMBEDDED, layer_tap(5))
    with pytest.raises(ModelUnavailable) as err:
        load_as_if(kind, path, feature_tap=layer_tap(5))
    message = str(err.value)
    assert f"feature_tap is {shipped_tap(kind, path)!r}, expected {layer_tap(5)!r}" in message
    assert "set drafter_head_layer to the layer its tap names" in message
