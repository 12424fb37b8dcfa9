"""Drafter calibration files: the scoring layer and per-head weights `pflash calibrate` measured.

A calibration replaces two guesses of the head scorer (§3.3) with measurements on needle
prompts whose evidence is known: which layer scores (instead of the profile default), and
how much each of that layer's query heads counts (a weighted mean over heads instead of
the plain mean, step 6). It is bound to one drafter file by sha256, because head weights
measured on one set of weights say nothing about another.

File format (JSON, `SCHEMA`):

- `schema`: "pflash_drafter_calibration_v1"
- `drafter`, `drafter_sha256` (`pflash.models.scoring_head.drafter_sha256` of the model
  file), `base_model`, `n_layers`, `n_heads`
- `layer`: the chosen scoring layer (0-based, the layer whose q_proj/k_proj score)
- `head_weights`: one weight per query head of `layer`, finite, >= 0, summing to 1
- `rule`: how the layer and weights were chosen, in words
- `calibration`: {families, lengths, seeds, source, prompts} the measurement used
- `per_layer`: [{layer, mean_top10, mean_mrr, weighted_top10, weighted_mrr, head_top10,
  head_mrr}] per layer (metrics over the calibration prompts)
- `validation`: held-out prompts (other seeds, other text) scored with the plain mean at
  the profile default layer and with the calibrated choice

`load_calibration` checks everything the scorer relies on and names the field it refuses.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from pflash.errors import ConfigError

SCHEMA = "pflash_drafter_calibration_v1"


@dataclass(frozen=True)
class Calibration:
    """A checked calibration: scoring `layer` and `head_weights` (one per query head, sum 1)."""

    path: str
    drafter_sha256: str
    base_model: str
    layer: int
    head_weights: tuple[float, ...]
    extra: dict  # the rest of the file (tables, prompts, validation), for reports


def _refuse(path: Path, field: str, value: object, allowed: str) -> ConfigError:
    return ConfigError("drafter_calibration", str(path), f"field {field!r} is {value!r}: {allowed}")


def load_calibration(
    path: str | Path, expected_sha256: str, n_layers: int, n_heads: int
) -> Calibration:
    """Read and check a calibration file (`resolve_artefact("calibration", ...)`) for a
    drafter with `n_layers` layers and `n_heads` query heads whose model file hashes to
    `expected_sha256`; refuse naming the field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            "drafter_calibration", str(path), "no such file; write one with `pflash calibrate`"
        ) from None
    except json.JSONDecodeError as e:
        raise ConfigError("drafter_calibration", str(path), f"not JSON: {e}") from None
    if not isinstance(data, dict):
        raise _refuse(path, "(top level)", type(data).__name__, "a JSON object")
    if data.get("schema") != SCHEMA:
        raise _refuse(path, "schema", data.get("schema"), f"must be {SCHEMA!r}")
    sha = data.get("drafter_sha256")
    if sha != expected_sha256:
        raise _refuse(
            path,
            "drafter_sha256",
            sha,
            f"this calibration is for another drafter file (loaded drafter: {expected_sha256}); "
            "run pflash calibrate for it",
        )
    layer = data.get("layer")
    if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < n_layers:
        raise _refuse(path, "layer", layer, f"a layer index in [0, {n_layers})")
    weights = data.get("head_weights")
    if not isinstance(weights, list) or len(weights) != n_heads:
        count = len(weights) if isinstance(weights, list) else weights
        raise _refuse(path, "head_weights", count, f"a list of {n_heads} weights, one per head")
    for h, w in enumerate(weights):
        if not isinstance(w, int | float) or isinstance(w, bool) or not math.isfinite(w) or w < 0:
            raise _refuse(path, f"head_weights[{h}]", w, "a finite number >= 0")
    total = float(sum(weights))
    if total <= 0:
        raise _refuse(path, "head_weights", weights, "at least one weight must be > 0")
    return Calibration(
        path=str(path),
        drafter_sha256=sha,
        base_model=str(data.get("base_model", "")),
        layer=layer,
        head_weights=tuple(float(w) / total for w in weights),
        extra={k: v for k, v in data.items() if k not in ("layer", "head_weights")},
    )


def write_calibration(path: str | Path, payload: dict) -> Path:
    """Write a calibration payload (already holding every field above) as indented JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": SCHEMA} | payload, indent=1) + "\n", encoding="utf-8")
    return path
