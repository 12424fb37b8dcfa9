"""The flow of one request through the stages of `pflash.compress`: `compressor` (plan, then
view, drafter, probe, selection and assembly, failing closed), `request` (what it takes and the
checks on it), `parts` (the remote parts it is given), `in_process` (those parts in this
process)."""
