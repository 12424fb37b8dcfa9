"""Scorer profiles (ALGORITHM §2): which layer of a drafter scores (the head layer L), which
layers the legacy scorer reads, and where the probe tap is. `qwen3`, `qwen35` and `generic`
(any decoder with `self_attn.q_proj/k_proj`); a measured layer for the generic profile."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from pflash.config import ScoringConfig
from pflash.errors import ConfigError, ModelUnavailable
from pflash.models.loading import LoadedModel

log = logging.getLogger(__name__)

# Generic profile head layer as a fraction of depth: layer 17 of SmolLM2-135M's 30, the
# shallowest layer that ranks the needle chunk near the top of every needle prompt in
# `python -m pflash_lab.bench.drafter_speed --sections layers --layer-prompts 18`; shallower
# layers miss it on more prompts, and a deeper one costs more (layer L costs L/30 of a full
# forward) without finding more.
GENERIC_HEAD_FRACTION = 0.57
QWEN3_REFERENCE = {"hidden_size": 1024, "num_hidden_layers": 28}
QWEN35_REFERENCE = {"hidden_size": 1024, "num_hidden_layers": 24}


# --------------------------------------------------------------------------- 1. profile


@dataclass(frozen=True)
class ScorerProfile:
    """Which layers a drafter scores with.

    - `head_layer` L: blocks 0..L-1 run; block L's NoPE Q/K give the head mass. The probe
      tap is the residual stream entering block L.
    - `legacy_layers`: layers the legacy running-max scorer reads (all computed layers for
      qwen3/generic, the full-attention layers for qwen35); `legacy_rope`: post-RoPE Q/K
      (qwen35, §3.2) instead of NoPE (§3.1).
    - `gated_q`: q_proj packs [query | gate] per head; the query half is used (qwen35).
    - `base_model`, `schema`: what a trained head file for this drafter must state.
    """

    name: str
    head_layer: int
    n_layers: int
    legacy_layers: tuple[int, ...]
    legacy_rope: bool
    gated_q: bool
    base_model: str
    schema: str

    @property
    def tap(self) -> str:
        """Feature tap name, as the reference writes it for block 15."""
        if self.head_layer == 0:
            return "embeddings_before_block0"
        return f"post_block{self.head_layer - 1}_residual_before_block{self.head_layer}"


def infer_profile_name(architecture: str) -> str:
    """GGUF architecture or HF model_type -> profile name."""
    arch = architecture.lower()
    if arch == "qwen3":
        return "qwen3"
    if arch in ("qwen35", "qwen3_5", "qwen3_5_text"):
        return "qwen35"
    return "generic"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _base_model_name(loaded: LoadedModel) -> str:
    facts = loaded.gguf
    if facts is not None and facts.basename:
        return f"{facts.basename}-{facts.size_label}" if facts.size_label else facts.basename
    if facts is not None and facts.name:
        return facts.name
    name = getattr(loaded.model.config, "_name_or_path", "") or loaded.model.config.model_type
    return str(name).rstrip("/").rsplit("/", 1)[-1]


def _matches(text_config, reference: dict) -> bool:
    return all(getattr(text_config, k, None) == v for k, v in reference.items())


def resolve_profile(
    loaded: LoadedModel, config: ScoringConfig, calibrated_layer: int | None = None
) -> ScorerProfile:
    """The scorer profile for a loaded drafter. Reads only `scoring` knobs (`config` may be
    the whole config or any part holding that component: they read the same names).

    The head layer is `drafter_head_layer` when set, else a calibration's `calibrated_layer`,
    else the profile default. Both set and different is a ConfigError: the calibration's
    head weights were measured at its own layer and mean nothing at another.
    """
    model = loaded.model
    text = model.config.get_text_config()
    n = text.num_hidden_layers
    name = config.drafter_profile
    if name == "auto":
        name = infer_profile_name(loaded.architecture or text.model_type)
    layer_types = list(getattr(text, "layer_types", None) or ["full_attention"] * n)
    attention_layers = tuple(i for i in range(n) if layer_types[i] != "linear_attention")
    if name == "qwen35":
        if not hasattr(model.model.layers[attention_layers[0]].self_attn, "q_norm"):
            raise ModelUnavailable(
                "drafter_profile qwen35 needs a Qwen3.5 model (gated attention with q_norm/k_norm)"
            )
        default = 15 if n == 24 else min(attention_layers, key=lambda i: (abs(i - 15 * n / 24), -i))
        reference = _matches(text, QWEN35_REFERENCE)
        base, schema = (
            ("Qwen/Qwen3.5-0.8B", "qwen3_5_0_8b") if reference else (_base_model_name(loaded), None)
        )
        legacy_layers, legacy_rope, gated = attention_layers, True, True
    elif name == "qwen3":
        default = 13 if n == 28 else round(13 * n / 28)
        reference = _matches(text, QWEN3_REFERENCE)
        base, schema = (
            ("Qwen/Qwen3-0.6B", "qwen3_0_6b") if reference else (_base_model_name(loaded), None)
        )
        legacy_layers, legacy_rope, gated = tuple(range(n)), False, False
    else:
        name = "generic"
        default = min(n - 1, round(GENERIC_HEAD_FRACTION * n))
        base, schema = _base_model_name(loaded), None
        legacy_layers, legacy_rope, gated = attention_layers, False, False
    explicit = config.drafter_head_layer
    if explicit is not None and calibrated_layer is not None and explicit != calibrated_layer:
        raise ConfigError(
            "drafter_head_layer",
            explicit,
            f"the calibration {config.drafter_calibration!r} chose layer {calibrated_layer} and "
            "its head weights hold only there; unset drafter_head_layer or drop the calibration",
        )
    head_layer = next(v for v in (explicit, calibrated_layer, default) if v is not None)
    if not 0 <= head_layer < n:
        raise ConfigError(
            "drafter_head_layer",
            head_layer,
            f"a layer index in [0, {n}) for this {n}-layer drafter",
        )
    if head_layer not in attention_layers:
        raise ConfigError(
            "drafter_head_layer",
            head_layer,
            f"an attention layer of this drafter: {list(attention_layers)}",
        )
    attn = model.model.layers[head_layer].self_attn
    if not (hasattr(attn, "q_proj") and hasattr(attn, "k_proj")):
        raise ModelUnavailable(
            f"drafter layer {head_layer} has no self_attn.q_proj/k_proj; the head scorer cannot read it"
        )
    return ScorerProfile(
        name=name,
        head_layer=head_layer,
        n_layers=n,
        legacy_layers=legacy_layers,
        legacy_rope=legacy_rope,
        gated_q=gated,
        base_model=base,
        schema=f"{schema or _slug(base)}_nope_qk_mass_v1",
    )
