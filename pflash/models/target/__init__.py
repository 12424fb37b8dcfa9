"""Target backends behind one contract (`protocol.py`): `hf` (transformers, in process; the
model-free steps of its decode loop in `decoding`) and `upstream` (an OpenAI-compatible server)."""
