"""Files bound to the drafter: scoring head, segment probe, tap projection, calibration.

Why one home: each was trained on one drafter file (bound by sha256) and, except the
calibration, at one scoring layer (bound by feature tap), and each config key takes the
same values: `embedded` (the file shipped in `pflash/data` for the embedded drafter), a
path, or nothing. So what ships, how a value becomes a file, why `embedded` is refused for
another drafter and how a file bound elsewhere is refused are written once, here, over
`ARTEFACTS`. Reading a file stays with its format: `pflash.models.drafter.scoring_head`
(`load_scoring_head`), `pflash.models.probe` (`load_segment_probe`),
`pflash.models.projection` (`load_tap_projection`) and
`pflash.models.drafter.calibration` (`load_calibration`) each read and check their own
file; the three GGUF formats check the binding with `refuse_unbound`, the calibration its
JSON `drafter_sha256` field. The table sits in config because config
refuses `embedded` for another drafter at load (`embedded_refusal`), and `pflash.models`
imports config, never the reverse.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pflash.config.components import EMBEDDED_SMOLLM2
from pflash.errors import ConfigError, ModelUnavailable

Kind = Literal["head", "probe", "projection", "calibration"]
EMBEDDED = "embedded"
DATA_DIR = Path(__file__).resolve().parents[1] / "data"


def layer_tap(layer: int) -> str:
    """The feature tap of scoring layer `layer`: the residual stream entering it."""
    return f"post_block{layer - 1}_residual_before_block{layer}"


@dataclass(frozen=True)
class Shipped:
    """One file in `pflash/data`: its name and the scoring layer it was trained at (None:
    bound to no tap, as a calibration is: it chooses the layer)."""

    name: str
    layer: int | None = None

    @property
    def tap(self) -> str | None:
        return None if self.layer is None else layer_tap(self.layer)


@dataclass(frozen=True)
class Artefact:
    """A kind of drafter-bound file: its config key (`field`), how messages name a file of
    it (`noun`) and its kind (`short`), the command that writes one (`train`), and what
    ships per drafter source, the default file first (the one `embedded` means when no
    shipped file reads the scoring layer's tap)."""

    kind: Kind
    field: str
    noun: str
    short: str
    train: str
    shipped: Mapping[str, tuple[Shipped, ...]]


ARTEFACTS: dict[Kind, Artefact] = {
    "head": Artefact(
        "head",
        "scoring_head_gguf",
        "scoring head",
        "head",
        "pflash head train",
        {
            EMBEDDED_SMOLLM2: (
                Shipped("smollm2_135m_scoring_head.gguf", 17),
                Shipped("smollm2_135m_scoring_head_l8.gguf", 8),
            )
        },
    ),
    "probe": Artefact(
        "probe",
        "segment_probe_gguf",
        "segment probe",
        "probe",
        "pflash probe train",
        {
            EMBEDDED_SMOLLM2: (
                Shipped("smollm2_135m_segment_probe.gguf", 17),
                Shipped("smollm2_135m_segment_probe_l8.gguf", 8),
            )
        },
    ),
    "projection": Artefact(
        "projection",
        "projection_gguf",
        "tap projection",
        "projection",
        "pflash projection train",
        {EMBEDDED_SMOLLM2: (Shipped("smollm2_135m_tap_projection_l8.gguf", 8),)},
    ),
    "calibration": Artefact(
        "calibration",
        "drafter_calibration",
        "calibration",
        "calibration",
        "pflash calibrate",
        {EMBEDDED_SMOLLM2: (Shipped("smollm2_135m_calibration.json"),)},
    ),
}


def embedded_refusal(kind: Kind, spec: object, drafter: str) -> str | None:
    """Why the config value `spec` of `kind` cannot serve `drafter`, or None: `embedded`
    names a file trained on another drafter file, which its sha256 check would refuse at
    start. The one check config runs at load and the resolver runs again."""
    a = ARTEFACTS[kind]
    if spec != EMBEDDED or drafter in a.shipped:
        return None
    return (
        f"'embedded' is the {a.short} for {', '.join(a.shipped)}; for drafter {drafter!r} "
        f"write one with `{a.train}` and give its path"
    )


def resolve_artefact(
    kind: Kind, spec: str | Path | None, drafter: str, tap: str | None = None
) -> Path | None:
    """The file the config value `spec` of `kind` names for `drafter`, or None when unset.

    `embedded` is the shipped file for the drafter, the one reading `tap` where one does,
    else the default (whose tap check at load names the mismatch); any other value is a
    path (`~` expanded). A file that is not there is `ModelUnavailable` naming the key; so
    is a shipped one missing from the installation, saying how to rebuild it."""
    if spec is None or str(spec) == "":
        return None
    a = ARTEFACTS[kind]
    if str(spec) != EMBEDDED:
        path = Path(os.path.expanduser(spec))
        if not path.is_file():
            raise ModelUnavailable(
                f"{a.noun} {path} not found; set {a.field} to an existing file "
                f"(`{a.train}` writes one) or unset it"
            )
        return path
    refusal = embedded_refusal(kind, EMBEDDED, drafter)
    if refusal:
        raise ConfigError(a.field, EMBEDDED, refusal)
    files = a.shipped[drafter]
    chosen = next((f for f in files if tap is not None and f.tap == tap), files[0])
    path = DATA_DIR / chosen.name
    if not path.is_file():
        layer = "" if chosen.layer is None else f" --layer {chosen.layer}"
        raise ModelUnavailable(
            f"{a.field} 'embedded': the shipped {a.noun} {path} is missing from this "
            f"installation; reinstall pflash, run `{a.train} --drafter {drafter}{layer} "
            f"--out {path}`, or unset {a.field}"
        )
    return path


def refuse_unbound(
    kind: Kind, path: str | Path, got: object, expected: object, keys: tuple[str, ...]
) -> None:
    """Refuse the file at `path` when it states another value than the drafter `expected`
    for one of `keys` (attributes of both): `ModelUnavailable` naming the first that
    differs, both values, and what it means."""
    a = ARTEFACTS[kind]
    hints = {
        "runtime_gguf_sha256": f"; the {a.short} was trained for a different drafter file",
        "feature_tap": f"; the {a.short} was trained at another scoring layer: set "
        "drafter_head_layer to the layer its tap names "
        "(post_block{L-1}_residual_before_block{L} is layer L) or train one for this layer",
    }
    for key in keys:
        g, w = getattr(got, key), getattr(expected, key)
        if g != w:
            raise ModelUnavailable(
                f"{a.noun} {path} does not fit this drafter: {key} is {g!r}, expected {w!r}"
                + hints.get(key, "")
            )
