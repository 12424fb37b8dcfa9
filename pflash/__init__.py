"""PFlash: drafter-scored long-prompt compression for LLM serving.

`pflash/` decides (pure functions over token ids, spans, scores and config); the Ray Serve
shell in `deployments/` only carries state and I/O. See DESIGN.md in the shared folder.
"""

__version__ = "0.1.0"
