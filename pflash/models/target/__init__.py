"""Target backends behind one contract (`protocol.py`): `hf` (transformers, in process) and
`upstream` (an OpenAI-compatible server)."""
