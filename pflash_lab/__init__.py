"""The lab: the benchmark harness (`bench/`), the trainers of what ships in pflash/data
(`train/`) and the text both build prompts from (`corpus/`).

It lives in the repository beside the product and is not part of the `pflash-serve`
distribution: a `pip install` of the product installs what serves. The lab imports the
product; the product never imports the lab. Its `pflash` commands (`bench`, `probe train`,
`head train`, `projection train`, `calibrate`) are registered under the `pflash.commands`
entry points, see `pflash_lab.commands`.
"""
