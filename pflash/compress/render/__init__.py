"""Render: a chat as the target's template writes it (`RenderedPrompt`, the one holder of a
request's text and encoding), its turns and groups, the tool fallback for a template that
cannot render tools, and which spans are instructions (kept verbatim) or documents."""
