"""Quality and speed benchmarks (`python -m pflash.bench.<name>`)."""
