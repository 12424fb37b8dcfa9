"""Quality and speed benchmarks (`python -m pflash_lab.bench.<name>`)."""
