"""Facts stated one way and asked another: the word resource of the fact families of
`pflash_lab.corpus.nonliteral` (the described functions are in `pflash_lab.corpus.code_descriptions`).

Why: every family in `pflash_lab.corpus.cases` asks with the words of its evidence ("the
special magic {key} number"), so lexical anchors find the needle by string match and
attention is never tested on meaning. Here each concept has several statement templates
and several question templates written so that **no statement shares a content word with
any question of its subject** (the unit test checks every pair with
`pflash_lab.corpus.wording`). The wording of a case is drawn from its seed, so no scorer can be
tuned to one phrasing.

- `SUBJECTS`: what facts are about (an organisation, a lease, a ship). Each has the nouns a
  question may call it by (never used in a statement) and its concepts.
- `Concept`: one attribute (founding year, early-exit fee, crew size, ...): statement
  templates over `{entity}` and `{value}`, question templates over `{noun}`, and how its
  value is drawn. Concept keys are unique over all subjects.

Every draw takes a `random.Random`, so a family stays a pure function of its seed.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal

ValueKind = Literal["number", "place", "person"]


@dataclass(frozen=True)
class Concept:
    """One attribute of a subject, stated and asked in several disjoint wordings.

    - `statements`: sentences with `{entity}` (the invented name) and `{value}`.
    - `questions`: questions with `{noun}` (the subject as a question names it); they never
      name the entity, so only meaning links a question to its statement.
    - `kind`, `low`, `high`: the value: an integer in [low, high], a place or a person.
    """

    key: str
    statements: tuple[str, ...]
    questions: tuple[str, ...]
    kind: ValueKind = "number"
    low: int = 0
    high: int = 0


@dataclass(frozen=True)
class Subject:
    """What facts are about: its concepts and the nouns questions call it by."""

    key: str
    nouns: tuple[str, ...]
    concepts: tuple[Concept, ...]


ORGANISATION = Subject(
    "organisation",
    ("firm", "business", "organisation"),
    (
        Concept(
            "founded",
            (
                "The {entity} company was incorporated in {value}.",
                "{entity} first opened its doors in {value}.",
                "The enterprise known as {entity} traces its origins to {value}.",
            ),
            (
                "In which year was the {noun} founded?",
                "When did the {noun} begin trading?",
                "What is the founding date of the {noun}?",
            ),
            low=1850,
            high=1989,
        ),
        Concept(
            "headquarters",
            (
                "The head office of {entity} is located in {value}.",
                "{entity} runs its central administration out of {value}.",
                "Corporate headquarters for {entity} stand in {value}.",
            ),
            (
                "In which city is the {noun} based?",
                "Where does the {noun} have its main base?",
                "What town is home to the {noun}'s principal seat?",
            ),
            kind="place",
        ),
        Concept(
            "employees",
            (
                "{entity} has a workforce of {value} people.",
                "The staff of {entity} numbers {value}.",
                "{entity} keeps {value} employees on its payroll.",
            ),
            (
                "How many men and women are on the {noun}'s books?",
                "How many persons does the {noun} engage?",
                "How large is the {noun}'s personnel?",
            ),
            low=150,
            high=9800,
        ),
        Concept(
            "revenue",
            (
                "{entity} reported annual sales of {value} thousand euros.",
                "The turnover of {entity} reached {value} thousand euros last fiscal period.",
                "{entity} took in revenue of {value} thousand euros over its latest "
                "accounting period.",
            ),
            (
                "How much money does the {noun} earn per year?",
                "What income does the {noun} bring in over twelve months?",
                "What are the {noun}'s gross receipts for a full financial cycle?",
            ),
            low=10_000,
            high=99_000,
        ),
        Concept(
            "outlets",
            (
                "{entity} runs {value} retail outlets.",
                "There are {value} {entity} stores across the country.",
                "The {entity} chain counts {value} shops.",
            ),
            (
                "How many branches does the {noun} have?",
                "How many sites serving customers does the {noun} maintain?",
                "What is the size of the {noun}'s branch network?",
            ),
            low=12,
            high=980,
        ),
        Concept(
            "founder",
            (
                "{entity} was started by {value}.",
                "The creator of {entity} is {value}.",
                "{value} launched {entity} from a rented garage.",
            ),
            (
                "Who founded the {noun}?",
                "Which individual brought the {noun} into being?",
                "Whose brainchild was the {noun}?",
            ),
            kind="person",
        ),
    ),
)

LEASE = Subject(
    "lease",
    ("contract", "arrangement", "deal"),
    (
        Concept(
            "early_exit_fee",
            (
                "The termination charge for the {entity} lease is {value} credits.",
                "Ending the {entity} rental agreement ahead of schedule costs {value} credits.",
                "A tenant who breaks the {entity} tenancy prematurely owes a penalty of "
                "{value} credits.",
            ),
            (
                "What is the fee for leaving the {noun} early?",
                "How much must be paid to exit the {noun} before it runs out?",
                "What price applies to walking away from the {noun} sooner than planned?",
            ),
            low=1000,
            high=9999,
        ),
        Concept(
            "rent",
            (
                "Monthly rent under the {entity} lease comes to {value} credits.",
                "Every month the {entity} tenant pays {value} credits for the premises.",
                "The {entity} rental agreement sets the recurring charge at {value} credits "
                "per month.",
            ),
            (
                "How much does occupying the place cost for each thirty-day cycle of the {noun}?",
                "What sum is due under the {noun} for using the property over roughly four weeks?",
                "What periodic amount does the occupant hand over to the landlord under the "
                "{noun}?",
            ),
            low=1000,
            high=9999,
        ),
        Concept(
            "deposit",
            (
                "The security deposit on the {entity} lease is {value} credits.",
                "Before moving in, {entity} tenants put down {value} credits as a guarantee.",
                "{entity} tenancy holders lodge {value} credits up front, returned at the end "
                "if nothing is damaged.",
            ),
            (
                "How much collateral must be handed over at the start of the {noun}?",
                "What refundable sum is paid when the {noun} begins?",
                "What amount is held back under the {noun} against possible harm to the property?",
            ),
            low=1000,
            high=9999,
        ),
        Concept(
            "notice_period",
            (
                "Under the {entity} lease, either side must give {value} days of notice "
                "before ending it.",
                "The {entity} rental agreement requires a warning of {value} days prior to "
                "cancellation.",
                "Cancelling the {entity} tenancy takes {value} days of advance written notice.",
            ),
            (
                "How far ahead must a party announce that it wants out of the {noun}?",
                "What forewarning, in time, is expected before quitting the {noun}?",
                "How long beforehand does someone have to signal departure from the {noun}?",
            ),
            low=60,
            high=365,
        ),
        Concept(
            "duration",
            (
                "The {entity} lease runs for {value} months.",
                "The term of the {entity} rental agreement is {value} months.",
                "The {entity} tenancy lasts {value} months from signing.",
            ),
            (
                "How long does the {noun} remain in force?",
                "For what span of time is the {noun} binding?",
                "What is the duration of the {noun}?",
            ),
            low=100,
            high=360,
        ),
    ),
)

VESSEL = Subject(
    "vessel",
    ("boat", "craft"),
    (
        Concept(
            "crew",
            (
                "The research ship {entity} sails with a complement of {value} hands.",
                "{entity} carries {value} sailors on a typical voyage.",
                "A crew of {value} mans the vessel {entity}.",
            ),
            (
                "How many people work aboard the {noun}?",
                "What is the size of the {noun}'s onboard team?",
                "How many seafarers staff the {noun}?",
            ),
            low=12,
            high=480,
        ),
        Concept(
            "launch_year",
            (
                "The vessel {entity} first touched water in {value}.",
                "{entity} left the shipyard in {value}.",
                "The research ship {entity} was launched in {value}.",
            ),
            (
                "When did the {noun} enter service?",
                "In which year was the {noun} put afloat?",
                "What is the construction year of the {noun}?",
            ),
            low=1890,
            high=1989,
        ),
        Concept(
            "home_port",
            (
                "{entity} is registered out of the harbour at {value}.",
                "The home port of the vessel {entity} is {value}.",
                "The research ship {entity} returns to {value} between expeditions.",
            ),
            (
                "Where does the {noun} normally dock?",
                "From which town does the {noun} operate?",
                "Which coastal settlement does the {noun} call its base?",
            ),
            kind="place",
        ),
        Concept(
            "length",
            (
                "{entity} measures {value} metres from bow to stern.",
                "The hull of the vessel {entity} is {value} metres long.",
                "The research ship {entity} has an overall length of {value} metres.",
            ),
            (
                "How big is the {noun}, end to end?",
                "What is the {noun}'s size in the fore-and-aft direction?",
                "How far is it from the front tip of the {noun} to its rear?",
            ),
            low=40,
            high=399,
        ),
        Concept(
            "range",
            (
                "{entity} can cover {value} nautical miles without refuelling.",
                "On one tank of fuel, the vessel {entity} travels {value} nautical miles.",
                "The research ship {entity} has a cruising range of {value} nautical miles.",
            ),
            (
                "How far can the {noun} go before it must fill up?",
                "What distance can the {noun} manage between bunkering stops?",
                "How much sea can the {noun} cross on a single load of diesel?",
            ),
            low=1000,
            high=9999,
        ),
    ),
)

SUBJECTS = (ORGANISATION, LEASE, VESSEL)

# An aggregation question opens with one of these, then asks each concept in turn.
AGGREGATE_FRAMES = (
    "About the {noun} described in the text above: {questions}",
    "Using only the document, tell me about the {noun}. {questions}",
    "I have several questions about the {noun}. {questions}",
)


# --------------------------------------------------------------------------- names and values

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
           "gr", "kr", "pl", "st", "tr", "qu", "th")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
_CODAS = ("", "n", "r", "l", "m", "s", "nd", "rt", "x", "lk")
_PLACE_ENDINGS = ("ford", "wick", "stead", "thorpe", "mere", "holm", "bury")
_FIRST_NAMES = ("Ilse", "Tomas", "Petra", "Anwar", "Mirela", "Oskar", "Lena", "Dario", "Hana",
                "Felix", "Ines", "Kofi", "Sabine", "Marek", "Yara", "Emil")  # fmt: skip


def _syllable(rng: random.Random) -> str:
    return rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)


FRESH_TRIES = 10_000  # a value range this many draws cannot escape is spent: fail, never hang


def _fresh(make, rng: random.Random, taken: set[str] | None, clash=None) -> str:
    for _ in range(FRESH_TRIES):
        value = make(rng)
        if taken is None or (value not in taken and not (clash and clash(value, taken))):
            if taken is not None:
                taken.add(value)
            return value
    raise ValueError(f"no fresh value left after {FRESH_TRIES} draws ({len(taken or ())} taken)")


def _digits_clash(value: str, taken: set[str]) -> bool:
    """Whether a number is part of a taken number or contains one ("48" in "1483"): a reply
    is scored by substring, so "1483" would also count as the answer "48"."""
    return any(t.isdigit() and (value in t or t in value) for t in taken)


def entity_name(rng: random.Random, taken: set[str] | None = None) -> str:
    """An invented proper name of two syllables ("Branvel"), distinct from `taken`."""
    return _fresh(lambda r: (_syllable(r) + _syllable(r)).capitalize(), rng, taken)


def place_name(rng: random.Random, taken: set[str] | None = None) -> str:
    """An invented town ("Dromwick"), distinct from `taken`."""
    return _fresh(lambda r: (_syllable(r) + r.choice(_PLACE_ENDINGS)).capitalize(), rng, taken)


def person_name(rng: random.Random, taken: set[str] | None = None) -> str:
    """A first name and an invented surname ("Petra Loumard"), distinct from `taken`."""
    return _fresh(
        lambda r: f"{r.choice(_FIRST_NAMES)} {(_syllable(r) + _syllable(r)).capitalize()}",
        rng,
        taken,
    )


def draw_value(concept: Concept, rng: random.Random, taken: set[str] | None = None) -> str:
    """A value of `concept`'s kind, distinct from `taken` (digits without separators, so
    a reply that states it matches verbatim; no number inside another taken one)."""
    if concept.kind == "place":
        return place_name(rng, taken)
    if concept.kind == "person":
        return person_name(rng, taken)
    return _fresh(lambda r: str(r.randint(concept.low, concept.high)), rng, taken, _digits_clash)


@dataclass(frozen=True)
class Fact:
    """One concept of one entity with its value, in the wordings a case drew for it."""

    concept: Concept
    entity: str
    value: str
    statement_template: str
    question: str

    @property
    def statement(self) -> str:
        return self.statement_template.format(entity=self.entity, value=self.value)


def draw_fact(
    concept: Concept, entity: str, noun: str, rng: random.Random, taken: set[str]
) -> Fact:
    """A fact with a seeded statement wording, question wording and value."""
    statement = rng.choice(concept.statements)
    question = rng.choice(concept.questions).format(noun=noun)
    return Fact(concept, entity, draw_value(concept, rng, taken), statement, question)


def statement_pattern(template: str) -> re.Pattern:
    """A regex matching exactly the sentences `template` states (groups `entity`, `value`):
    how a test tells which concept a paragraph states, or that it states none."""
    parts = re.split(r"(\{entity\}|\{value\})", template)
    return re.compile(
        "".join(
            {
                "{entity}": r"(?P<entity>[A-Z][a-z]+)",
                "{value}": r"(?P<value>[A-Z][a-z]+ [A-Z][a-z]+|\w+)",
            }.get(p, re.escape(p))
            for p in parts
        )
        + "$"
    )
