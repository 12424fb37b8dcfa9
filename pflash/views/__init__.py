"""Multi-turn views: the view record and the per-turn decision (`decision`), the store keys
(`keys`), the bounded per-tenant store (`store`) and the adaptive keep controller."""
