"""The flow of one request through the stages of `pflash.compress`: `compressor` (plan, then
view, drafter, probe, selection and assembly, failing closed), `request` (its request made
from an API request, and the checks on it), `parts` (the remote parts it is given),
`in_process` (those parts in this process)."""
