"""Thin Ray Serve wrappers around pflash/: they hold processes, models and caches; pflash decides."""
