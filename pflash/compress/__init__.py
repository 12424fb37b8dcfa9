"""The pure request flow, stage by stage: `render` (the chat as the target's template writes
it), `plan` (query, budget, segments), `evidence` (lexical and passage signals mixed into the
drafter's scores), `selection` (which spans survive), and at this level the scorer contract
(`scoring`), the two steps around the drafter call (`pipeline`), assembly (`assemble`) and the
memo one turn leaves the next (`turn_memo`); `text` holds the text rules they share.
`pflash/flow/compressor.py` runs these stages for one request."""
