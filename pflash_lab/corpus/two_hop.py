"""Two-hop questions over encyclopedia-style entries: the `two_hop` family.

Why: a question such as "Where was the director of The Tallow Moon born?" needs two
passages. The first (hop 1, "The Tallow Moon was directed by Mara Quell.") names the work the
question names and a bridge entity the question does not; the second (hop 2, "Quell is a
native of Tavisham.") is about the bridge entity and shares no content word with the
question, so neither lexical anchors nor the question's own names reach it, and the
sentence embedder ranks it among every other "native of" sentence. Distractor entries share
the question's words (other works of the same kind, whose makers were born, raised or
schooled elsewhere), so a passage that merely reads like the question is no answer.

The resource is hand-written and fictional: `LINKS` (a work and its maker: a film and its
director, a novel and its author, a ship and its builder, ...) and `ATTRIBUTES` (what is
asked of the maker: birthplace, upbringing, schooling, resting place). Every link pairs
with every attribute, so there are `len(LINKS) * len(ATTRIBUTES)` bridge chains, each
asked in `len(roles) * len(questions)` phrasings. A hop-2 statement never shares a
content word (`pflash_lab.corpus.wording.shared_words`) with any question of its chain:
the unit test checks every template pair, and `two_hop` redraws names until the generated
question and hop-2 sentence share none either.

Gold: both supporting sentences (hop 1 and hop 2) reach the target verbatim.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from pflash_lab.corpus.cases import (
    BenchCase,
    CaseSpec,
    CountTokens,
    Turn,
    _body_tokens,
    _depth,
    haystack,
    insert_at_depths,
)
from pflash_lab.corpus.wording import shared_words


@dataclass(frozen=True)
class Link:
    """Hop 1: a work and its maker. `roles` name the maker by the work in a question
    (`{work}`); `statements` say who made it (`{work}`, `{person}`); `kind` is how the
    work's own entry describes it; `titles` are how its name is drawn."""

    key: str
    roles: tuple[str, ...]
    statements: tuple[str, ...]
    kind: str
    titles: tuple[tuple[str, ...], tuple[str, ...]]


@dataclass(frozen=True)
class Attribute:
    """Hop 2: a fact about the maker. `questions` ask it of `{role}`; `statements` state it
    of `{person}` with `{value}` (never a word of any question); `values` is its pool;
    `near_misses` state the same kind of fact in the question's own words (distractors)."""

    key: str
    questions: tuple[str, ...]
    statements: tuple[str, ...]
    values: tuple[str, ...]
    near_misses: tuple[str, ...]


_TOWNS = (
    "Tavisham", "Kestow", "Orlen Cross", "Marrowgate", "Pellinford", "Sutterby", "Ulvane",
    "Drossick", "Hollin Vale", "Carrowmere", "Essendry", "Brackwater", "Lunderhay", "Quarnby",
    "Fenwold", "Istrabel", "Norreby", "Vantmoor", "Okkerton", "Selbray",
)  # fmt: skip
_ACADEMIES = (
    "the Ardent Conservatory", "Velloran College", "the Brisk Institute", "Saint Oswy Lyceum",
    "the Morrow Polytechnic", "Glennard College", "the Hadley Seminary", "Tressin Lyceum",
    "the Corvane Institute", "Lowmarch College", "the Ebbing Conservatory", "Pyrford Lyceum",
)  # fmt: skip

ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute(
        "birthplace",
        ("Where was {role} born?", "What is the birthplace of {role}?"),
        ("{person} is a native of {value}.", "{person} came into the world at {value}."),
        _TOWNS,
        ("{person}, {role}, was born in {value}.", "The birthplace of {role}, {person}, is {value}."),
    ),
    Attribute(
        "upbringing",
        ("In which town did {role} grow up?", "Where did {role} spend their childhood?"),
        ("{person} was raised in {value}.", "{person} passed the early years of life in {value}."),
        _TOWNS,
        ("{person}, {role}, grew up in the town of {value}.", "{role}, {person}, spent a childhood in {value}."),
    ),
    Attribute(
        "schooling",
        ("Which school did {role} attend?", "Where was {role} educated?"),
        ("{person} studied at {value}.", "{person} trained for four years at {value}."),
        _ACADEMIES,
        ("{person}, {role}, attended school at {value}.", "{role}, {person}, was educated at {value}."),
    ),
    Attribute(
        "resting_place",
        ("Where is {role} buried?", "In which place was {role} buried?"),
        ("{person} was laid to rest in {value}.", "The grave of {person} lies in {value}."),
        _TOWNS,
        ("{person}, {role}, is buried in {value}.", "{role}, {person}, was buried at {value}."),
    ),
)  # fmt: skip

_ADJ = (
    "Tallow", "Amber", "Silent", "Crimson", "Hollow", "Northern", "Glass", "Iron", "Paper",
    "Velvet", "Winter", "Copper", "Distant", "Pale", "Restless", "Sunken",
)  # fmt: skip
_NOUN = (
    "Moon", "Orchard", "Lantern", "Harbour", "Meadow", "Crown", "Staircase", "Garden",
    "Tide", "Bell", "Kingdom", "Frontier", "Mirror", "Sparrow", "Citadel", "Archive",
)  # fmt: skip
_TITLE = (tuple(f"The {a}" for a in _ADJ), _NOUN)

LINKS: tuple[Link, ...] = (
    Link(
        "film",
        ("the director of {work}", "the person who directed {work}", "the filmmaker behind {work}"),
        ("{work} was directed by {person}.", "{work} is a drama film directed by {person}."),
        "a feature film",
        _TITLE,
    ),
    Link(
        "novel",
        ("the author of {work}", "the person who wrote {work}", "the writer of {work}"),
        ("{work} is a novel written by {person}.", "{work} was written by {person}."),
        "a novel",
        _TITLE,
    ),
    Link(
        "ship",
        ("the builder of the ship {work}", "the shipwright who built {work}"),
        ("The ship {work} was built by {person}.", "{work} is a schooner built by {person}."),
        "a sailing vessel",
        (("Marigold", "Osprey", "Halcyon", "Wayfarer", "Perseverance", "Kittiwake"), ("II", "III", "IV")),
    ),
    Link(
        "company",
        ("the founder of {work}", "the person who founded {work}"),
        ("{work} was founded by {person}.", "{work} is a trading house founded by {person}."),
        "a trading house",
        (("Brightwell", "Ashcombe", "Dunmore", "Farrow", "Kelsey", "Wexley"), ("Holdings", "Mercantile", "Brothers")),
    ),
    Link(
        "album",
        ("the producer of the album {work}", "the person who produced the album {work}"),
        ("The album {work} was produced by {person}.", "{work} is a studio album produced by {person}."),
        "a studio album",
        _TITLE,
    ),
    Link(
        "bridge",
        ("the engineer who designed {work}", "the designer of {work}"),
        ("{work} was designed by {person}.", "{work} is a viaduct designed by {person}."),
        "a stone viaduct",
        (("Harlow", "Cressing", "Millbrook", "Stannard", "Ockley", "Ravel"), ("Viaduct", "Crossing", "Span")),
    ),
    Link(
        "painting",
        ("the painter of {work}", "the artist who painted {work}"),
        ("{work} was painted by {person}.", "{work} is an oil painting by the painter {person}."),
        "an oil painting",
        _TITLE,
    ),
    Link(
        "opera",
        ("the composer of {work}", "the person who composed {work}"),
        ("{work} is an opera composed by {person}.", "{work} was composed by {person}."),
        "an opera",
        _TITLE,
    ),
)  # fmt: skip

_FIRST = (
    "Mara", "Olin", "Tessaly", "Ivo", "Renata", "Casimir", "Liesl", "Aurel", "Brannagh",
    "Dorian", "Elspeth", "Fenn", "Ysolde", "Matthias", "Noor", "Perrin",
)  # fmt: skip
_LAST = (
    "Quell", "Varre", "Brannick", "Ostrander", "Lisk", "Vautrin", "Hemmerly", "Sorrell",
    "Tulliver", "Abernathy", "Kestrel", "Malvoisin", "Drury", "Pennick", "Zolner", "Ardo",
    "Castellane", "Whitlock", "Morcant", "Ingram", "Fairweather", "Oddny", "Belcourt", "Harrowby",
    "Vasko", "Lindqvist", "Prentiss", "Rookwood", "Somerled", "Tarrant", "Umber", "Yelland",
    "Cranleigh", "Dunstable", "Ellery", "Galloway", "Hartigan", "Jessop", "Larkspur", "Nettleford",
)  # fmt: skip

# Sentences of an entry that neither hop needs: about a work, then about a person.
_WORK_FILLER = (
    "{work} is {kind} first presented to the public in {year}.",
    "Reviews of {work} at the time were mixed, though its reputation grew in later decades.",
    "A restored edition of {work} was catalogued by the national archive in {year2}.",
    "{work} has been the subject of several retrospectives and one long essay.",
)
_PERSON_FILLER = (
    "{person} worked for most of a long career with a small and loyal circle of collaborators.",
    "In later life {person} gave occasional lectures and kept extensive notebooks.",
    "Letters written by {person} were collected and published in {year2}.",
    "{person} declined most interviews and rarely travelled abroad.",
)

CHAINS = tuple(itertools.product(LINKS, ATTRIBUTES))
ARTICLE_TOKENS = 110  # about one work entry and one person entry of a distractor chain


@dataclass(frozen=True)
class Chain:
    """One drawn chain: the work, its maker, the answer value and the entries' texts."""

    work: str
    person: str
    value: str
    hop1: str
    hop2: str
    work_entry: str
    person_entry: str


def _draw_name(rng: random.Random, pools, taken: set[str]) -> str:
    """A name of `pools` (first part, second part) not yet `taken`; once the pools run out
    (a long case of a kind with few names), the first free one with a numeral after it."""
    for _ in range(len(pools[0]) * len(pools[1])):
        name = f"{rng.choice(pools[0])} {rng.choice(pools[1])}"
        if name not in taken:
            taken.add(name)
            return name
    for numeral, (a, b) in itertools.product(_NUMERALS, itertools.product(*pools)):
        name = f"{a} {b} {numeral}"
        if name not in taken:
            taken.add(name)
            return name
    raise ValueError(f"more than {len(taken)} names asked of one case")


_NUMERALS = ("Secundus", "Tertius", "Quartus", "Quintus", "Sextus", "Septimus", "Octavus")


def _draw_person(rng: random.Random, taken: set[str]) -> str:
    """A full name whose surname no other person of the case has: an entry's later
    sentences name its person by the surname alone, as encyclopedias do."""
    first = rng.choice(_FIRST)
    last = rng.choice([n for n in _LAST if n not in taken] or _LAST)
    taken.add(last)
    return f"{first} {last}"


def _surname(rng: random.Random, person: str) -> str:
    """How a later sentence of an entry names its person: the full name or the surname."""
    return person if rng.random() < 0.5 else person.split()[-1]


def _chain(
    rng: random.Random, link: Link, attr: Attribute, taken: set[str], avoid: str = ""
) -> Chain:
    """A chain with fresh names whose value is not `avoid` (the asked chain's answer)."""
    work = _draw_name(rng, link.titles, taken)
    person = _draw_person(rng, taken)
    value = rng.choice([v for v in attr.values if v != avoid])
    year = rng.randrange(1820, 1990)
    hop1 = rng.choice(link.statements).format(work=work, person=person)
    hop2 = rng.choice(attr.statements).format(person=_surname(rng, person), value=value)
    fill = dict(
        work=work, person=person, kind=link.kind, year=year, year2=year + rng.randrange(5, 40)
    )
    work_lines = [_WORK_FILLER[0].format(**fill), hop1, rng.choice(_WORK_FILLER[1:]).format(**fill)]
    person_lines = [
        _PERSON_FILLER[0].format(**fill),
        hop2,
        rng.choice(_PERSON_FILLER[1:]).format(**{**fill, "person": _surname(rng, person)}),
    ]
    return Chain(work, person, value, hop1, hop2, " ".join(work_lines), " ".join(person_lines))


def _near_miss(rng: random.Random, link: Link, attr: Attribute, taken: set[str], avoid: str) -> str:
    """A sentence in the question's own words about another work of the same kind."""
    work = _draw_name(rng, link.titles, taken)
    person = _draw_person(rng, taken)
    role = rng.choice(link.roles).format(work=work)
    text = rng.choice(attr.near_misses).format(
        person=person, role=role, value=rng.choice([v for v in attr.values if v != avoid])
    )
    return text[0].upper() + text[1:]


def distractor_chains(length: int) -> int:
    """Distractor entries (work and maker) for a prompt of `length` tokens: about a third of
    the text, the rest filler paragraphs."""
    return max(3, length // (3 * ARTICLE_TOKENS))


def two_hop(spec: CaseSpec, count: CountTokens) -> BenchCase:
    """One two-hop question: the asked chain's work entry (hop 1) and its maker's entry
    (hop 2, no content word shared with the question), entries of other works of the same
    kind and others (distractors), sentences in the question's own words about other works
    (near misses), then filler paragraphs to the length."""
    rng = random.Random(spec.seed)
    link, attr = rng.choice(CHAINS)
    taken: set[str] = set()
    while True:  # redraw until the names bring in no word the question shares with hop 2
        asked = _chain(rng, link, attr, taken)
        role = rng.choice(link.roles).format(work=asked.work)
        question = rng.choice(attr.questions).format(role=role)
        question = question[0].upper() + question[1:]
        if not shared_words(question, asked.hop2) and not shared_words(
            question, asked.person_entry
        ):
            break
    n_chains = distractor_chains(spec.length)
    others = [_chain(rng, link, attr, taken, asked.value) for _ in range(max(2, n_chains // 2))]
    others += [
        _chain(rng, *rng.choice(CHAINS), taken, asked.value) for _ in range(n_chains - len(others))
    ]
    near = [_near_miss(rng, link, attr, taken, asked.value) for _ in range(max(2, n_chains // 3))]
    entries = [(rng.random(), t) for c in others for t in (c.work_entry, c.person_entry)]
    entries += [(rng.random(), t) for t in near]
    hop1_depth = _depth(spec, rng)
    hop2_depth = min(max(hop1_depth + rng.uniform(-0.5, 0.5), 0.0), 1.0)
    items = [(hop1_depth, asked.work_entry), (hop2_depth, asked.person_entry), *entries]
    body = _body_tokens(spec, count, [text for _, text in items] + [question])
    hay = haystack(rng, body, count) if body > 64 else []
    doc = "\n\n".join(insert_at_depths(hay, items))
    turn = Turn(question, (asked.value,), (asked.hop1, asked.hop2))
    return BenchCase(spec, doc, (turn,))
