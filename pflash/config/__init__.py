"""Every PFlash knob in one typed, validated object, nested by component.

- `components.py`: the components (gate, selection, legacy, lexical, views, scoring,
  generation, server, security): every knob's type, bounds, default and description.
- `flat.py`: the compatibility layer: flat keys in YAML, dicts and attribute reads, and a
  flat `model_dump()`, for the whole config and for parts alike.
- `model.py`: `PFlashConfig` (the whole, with the checks that span keys), the parts the
  deployments and the request flow's stages receive, and loading from YAML and `PFLASH_*`
  environment.
- `table.py`: the configuration tables (docs/CONFIGURATION.md, README.md).
"""

from pflash.config.components import (
    EMBEDDED_HEAD_LAYER,
    EMBEDDED_SMOLLM2,
    UNTUNED_SCORING,
    Component,
    DrafterProfile,
    GateConfig,
    GenerationConfig,
    LexicalConfig,
    LexicalMode,
    LexicalQuery,
    Mode,
    OnDrafterError,
    PositionPrior,
    QueryParser,
    ScoreMode,
    ScorerKind,
    ScoringConfig,
    SecurityConfig,
    SegmentsMode,
    SelectionConfig,
    SelectMode,
    ServerConfig,
    TargetBackend,
    ViewsConfig,
)
from pflash.config.flat import ComponentSet
from pflash.config.legacy import LegacySelectionConfig
from pflash.config.model import (
    COMPONENTS,
    ENV_PREFIX,
    FIELDS,
    AdmissionPart,
    CompressionPart,
    DrafterScorerPart,
    PFlashConfig,
    RequestOverrides,
    TargetModelPart,
    ViewPart,
    build_config,
    build_part,
    field_info,
    load_config,
)
from pflash.config.table import KNOBS, config_table, knobs_table

__all__ = [
    "EMBEDDED_HEAD_LAYER",
    "UNTUNED_SCORING",
    "COMPONENTS",
    "EMBEDDED_SMOLLM2",
    "ENV_PREFIX",
    "FIELDS",
    "KNOBS",
    "AdmissionPart",
    "Component",
    "ComponentSet",
    "CompressionPart",
    "DrafterProfile",
    "DrafterScorerPart",
    "RequestOverrides",
    "GateConfig",
    "GenerationConfig",
    "LegacySelectionConfig",
    "LexicalConfig",
    "LexicalMode",
    "LexicalQuery",
    "Mode",
    "OnDrafterError",
    "PFlashConfig",
    "PositionPrior",
    "QueryParser",
    "ScoreMode",
    "ScorerKind",
    "ScoringConfig",
    "SecurityConfig",
    "SegmentsMode",
    "SelectMode",
    "SelectionConfig",
    "ServerConfig",
    "TargetBackend",
    "TargetModelPart",
    "ViewPart",
    "ViewsConfig",
    "build_config",
    "build_part",
    "config_table",
    "field_info",
    "knobs_table",
    "load_config",
]
