"""Multi-turn views: the view and decision records (`records`), the per-turn decision
(`decision`), the store keys (`keys`), the bounded per-tenant store (`store`) and the adaptive
keep controller."""
