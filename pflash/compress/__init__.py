"""The pure request flow, stage by stage: chat rendering and parsing, query planning, budget,
segments, selection, lexical evidence, position prior, assembly, and the scorer contract.
`pflash/compressor.py` runs these stages for one request."""
