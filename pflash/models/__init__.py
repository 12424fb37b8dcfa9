"""Torch-side code: model loading, the drafter scorer, the segment probe, target backends."""
