"""Text the project builds prompts from, for benchmarks and training alike: real prose and
code that ship on every machine (license texts, Python stdlib sources) and the synthetic
cases made from them (needles, multi-key, variable tracking, code retrieval, ...)."""
