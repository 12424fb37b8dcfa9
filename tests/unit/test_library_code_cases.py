"""The described-library-code family: Jinja2 functions, asked by descriptions that share no
content word with the function's source, each case holding its target whole and once."""

from __future__ import annotations

import pytest

from pflash_lab.corpus.cases import CaseSpec, token_counter
from pflash_lab.corpus.code_descriptions import CODE_QUESTION_FRAMES
from pflash_lab.corpus.families import FAMILIES, generate
from pflash_lab.corpus.library_descriptions import LIBRARY_FUNCTIONS
from pflash_lab.corpus.nonliteral import described_library_functions
from pflash_lab.corpus.wording import shared_words

FAMILY = "described_library_code"


@pytest.fixture(scope="module")
def count(smollm2_tokenizer):
    return token_counter(smollm2_tokenizer)


def test_family_is_registered():
    assert FAMILIES[FAMILY].__name__ == FAMILY


def test_enough_library_functions_keep_a_description_sharing_no_word_with_their_source():
    usable = described_library_functions()
    assert len(usable) >= 20
    assert len(usable) >= 0.85 * len(LIBRARY_FUNCTIONS)
    for desc, func in usable:
        assert func.source.lstrip().startswith(f"def {desc.name}(")
        for d in desc.descriptions:
            for frame in CODE_QUESTION_FRAMES:
                assert not shared_words(frame.format(description=d), func.source), (desc.name, d)


@pytest.mark.parametrize("length", [2048, 7000])
def test_a_case_holds_its_whole_target_once_near_the_length(count, length):
    names = set()
    for seed in range(8):
        case = generate(CaseSpec(FAMILY, seed, length), count)
        (turn,) = case.turns
        (source,) = turn.evidence
        (name,) = turn.answers
        names.add(name)
        assert case.document.count(source) == 1
        assert case.document.count(f"def {name}(") == 1
        assert source.startswith(f"def {name}(")
        assert not shared_words(turn.question, source)
        assert 0.85 * length <= count(case.document) <= length
    assert len(names) >= 4  # the seed draws different functions
