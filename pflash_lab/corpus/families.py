"""Every bench family by name (`FAMILIES`) and `generate`, the one way a case is made from
its spec.

The literal families live in `pflash_lab.corpus.cases`; the non-literal ones live in
`pflash_lab.corpus.nonliteral`, which builds on `cases`. The registry of both sits here,
above the two, so neither module has to import the other's dependant.
"""

from __future__ import annotations

from collections.abc import Callable

from pflash_lab.corpus.cases import (
    BenchCase,
    CaseSpec,
    CountTokens,
    code_retrieval,
    common_words,
    multi_key,
    multi_query,
    multi_turn,
    multi_value,
    placement,
    single_needle,
    system_document,
    variable_tracking,
)
from pflash_lab.corpus.nonliteral import (
    aggregation,
    described_code,
    described_library_code,
    multi_turn_paraphrase,
    paraphrased_needle,
)
from pflash_lab.corpus.two_hop import two_hop

FAMILIES: dict[str, Callable[[CaseSpec, CountTokens], BenchCase]] = {
    "single_needle": single_needle,
    "multi_key": multi_key,
    "multi_value": multi_value,
    "multi_query": multi_query,
    "variable_tracking": variable_tracking,
    "common_words": common_words,
    "code_retrieval": code_retrieval,
    "multi_turn": multi_turn,
    "placement": placement,
    "system_document": system_document,
    "paraphrased_needle": paraphrased_needle,
    "described_code": described_code,
    "described_library_code": described_library_code,
    "multi_turn_paraphrase": multi_turn_paraphrase,
    "aggregation": aggregation,
    "two_hop": two_hop,
}


def generate(spec: CaseSpec, count: CountTokens) -> BenchCase:
    """The case for `spec` (deterministic: the same spec and counter give the same case)."""
    try:
        family = FAMILIES[spec.family]
    except KeyError:
        raise ValueError(f"unknown family {spec.family!r}; known: {', '.join(FAMILIES)}") from None
    return family(spec, count)
