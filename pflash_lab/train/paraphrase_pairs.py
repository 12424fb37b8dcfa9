"""Facts stated one way and asked another, for *training* the scoring head only.

Why a second resource: the bench's non-literal families (`pflash_lab.corpus.paraphrase`) must
stay held out, so a head trained on paraphrase-style pairs may not see their subjects,
concepts or wordings. These subjects (a hospital, a bridge, a festival, a mine) and their
wordings are written separately, under the same rule: no statement shares a content word
with any question of its concept, and no question noun occurs in a statement (the unit test
checks every pair with `pflash_lab.corpus.wording`). Some kinds of value recur (a year, a
headcount, a person) because they recur in any text; no sentence does.

`TRAIN_SUBJECTS` feeds the head corpus's `paraphrase_pairs` family
(`pflash_lab.train.head_corpus`), which builds its documents with the bench's own fact-document
machinery (`pflash_lab.corpus.nonliteral.facts_document`: same distractor density, same value
rules), so the only difference from `paraphrased_needle` is whose words are used.
"""

from __future__ import annotations

from pflash_lab.corpus.paraphrase import Concept, Subject

HOSPITAL = Subject(
    "hospital",
    ("clinic", "infirmary"),
    (
        Concept(
            "beds",
            (
                "{entity} Hospital maintains {value} beds for admitted patients.",
                "Up to {value} patients can sleep on the wards of {entity} Hospital.",
                "The inpatient capacity of {entity} Hospital is {value} beds.",
            ),
            (
                "How many people can the {noun} keep overnight?",
                "How large is the {noun} in terms of places to lie down?",
                "What number of sick persons fit inside the {noun} at once?",
            ),
            low=40,
            high=900,
        ),
        Concept(
            "surgeons",
            (
                "{entity} Hospital employs {value} surgeons.",
                "A team of {value} operating physicians works at {entity} Hospital.",
                "{value} surgical specialists practise at {entity} Hospital.",
            ),
            (
                "How many doctors at the {noun} do procedures under anaesthesia?",
                "How big is the {noun}'s theatre personnel?",
                "What is the headcount of scalpel-wielding medics at the {noun}?",
            ),
            low=20,
            high=300,
        ),
        Concept(
            "opened",
            (
                "{entity} Hospital admitted its first patient in {value}.",
                "The doors of {entity} Hospital were opened in {value}.",
                "{entity} Hospital has been treating the ill since {value}.",
            ),
            (
                "When was the {noun} established?",
                "From which year onward has the {noun} existed?",
                "In what year did the {noun} begin receiving the sick?",
            ),
            low=1850,
            high=1989,
        ),
        Concept(
            "director",
            (
                "The chief executive of {entity} Hospital is {value}.",
                "{value} runs {entity} Hospital.",
                "{entity} Hospital is headed by {value}.",
            ),
            (
                "Who is in charge of the {noun}?",
                "Who manages the {noun}?",
                "Who leads the {noun}?",
            ),
            kind="person",
        ),
    ),
)

BRIDGE = Subject(
    "bridge",
    ("crossing", "viaduct"),
    (
        Concept(
            "span",
            (
                "The {entity} Bridge stretches {value} metres between its abutments.",
                "{entity} Bridge has a total length of {value} metres.",
                "From one bank to the other, {entity} Bridge extends {value} metres.",
            ),
            (
                "How far does the {noun} reach from end to end?",
                "What distance does the {noun} cover over the water?",
                "How much ground does the {noun} traverse?",
            ),
            low=100,
            high=2999,
        ),
        Concept(
            "toll",
            (
                "Drivers pay {value} cents to use {entity} Bridge.",
                "The toll on {entity} Bridge is {value} cents per car.",
                "Motorists are charged {value} cents at the {entity} Bridge booth.",
            ),
            (
                "What fee applies for taking an automobile over the {noun}?",
                "How much must one hand over to get to the far side via the {noun}?",
                "What is the price of passage over the {noun}?",
            ),
            low=100,
            high=999,
        ),
        Concept(
            "completed",
            (
                "{entity} Bridge carried its first traffic in {value}.",
                "{entity} Bridge was completed in {value}.",
                "Work on {entity} Bridge finished in {value}.",
            ),
            (
                "When did the {noun} open?",
                "In which year could people begin to go over the {noun}?",
                "What year was the {noun} inaugurated?",
            ),
            low=1850,
            high=1989,
        ),
        Concept(
            "clearance",
            (
                "Ships up to {value} feet tall can pass beneath {entity} Bridge.",
                "The clearance under {entity} Bridge is {value} feet.",
                "The deck of {entity} Bridge sits {value} feet above the river.",
            ),
            (
                "How high over the water is the {noun}?",
                "What is the elevation of the {noun}'s roadway?",
                "How much vertical room do boats have below the {noun}?",
            ),
            low=100,
            high=400,
        ),
    ),
)

FESTIVAL = Subject(
    "festival",
    ("event", "gathering"),
    (
        Concept(
            "visitors",
            (
                "Last summer {value} people attended the {entity} Festival.",
                "The {entity} Festival drew a crowd of {value}.",
                "Ticket sales for the {entity} Festival reached {value}.",
            ),
            (
                "How many guests came to the {noun}?",
                "How big was the audience at the {noun}?",
                "How many visitors turned up for the {noun}?",
            ),
            low=1000,
            high=99_000,
        ),
        Concept(
            "hours",
            (
                "The {entity} Festival lasts {value} hours.",
                "For {value} hours each year the {entity} Festival fills the town.",
                "The {entity} Festival runs over {value} consecutive hours.",
            ),
            (
                "How long does the {noun} go on?",
                "For what stretch of time is the {noun} held?",
                "What is the length of the {noun}?",
            ),
            low=120,
            high=720,
        ),
        Concept(
            "festival_founder",
            (
                "The {entity} Festival was started by {value}.",
                "{value} created the {entity} Festival.",
                "The {entity} Festival owes its existence to {value}.",
            ),
            (
                "Who launched the {noun}?",
                "Who first organised the {noun}?",
                "Who came up with the {noun}?",
            ),
            kind="person",
        ),
        Concept(
            "stalls",
            (
                "Traders run {value} stalls at the {entity} Festival.",
                "The {entity} Festival hosts {value} market booths.",
                "{value} vendors sell goods at the {entity} Festival.",
            ),
            (
                "How many places to shop does the {noun} offer?",
                "How many merchants set up at the {noun}?",
                "How many kiosks are at the {noun}?",
            ),
            low=100,
            high=999,
        ),
    ),
)

MINE = Subject(
    "mine",
    ("pit", "colliery"),
    (
        Concept(
            "depth",
            (
                "The {entity} Mine reaches {value} metres underground.",
                "The lowest shaft of {entity} Mine goes down {value} metres.",
                "The bottom gallery of {entity} Mine lies {value} metres below the surface.",
            ),
            (
                "What is the vertical extent of the {noun}?",
                "How far beneath the earth do the {noun}'s tunnels descend?",
                "How deep is the {noun}?",
            ),
            low=100,
            high=3999,
        ),
        Concept(
            "output",
            (
                "{entity} Mine produces {value} tonnes of ore a year.",
                "Each year {value} tonnes of rock are hauled out of {entity} Mine.",
                "The annual yield of {entity} Mine is {value} tonnes.",
            ),
            (
                "How much material does the {noun} extract per twelve months?",
                "What weight does the {noun} bring to the top in a typical season?",
                "What is the output of the {noun}?",
            ),
            low=10_000,
            high=99_000,
        ),
        Concept(
            "miners",
            (
                "{value} miners work in {entity} Mine.",
                "The {entity} Mine employs a labour force of {value}.",
                "{entity} Mine has {value} workers on its shifts.",
            ),
            (
                "How many men and women dig at the {noun}?",
                "How big is the {noun}'s crew?",
                "What headcount does the {noun} have?",
            ),
            low=50,
            high=4000,
        ),
        Concept(
            "owner",
            (
                "{entity} Mine belongs to {value}.",
                "{value} owns {entity} Mine.",
                "The proprietor of {entity} Mine is {value}.",
            ),
            (
                "Who holds title to the {noun}?",
                "Whose possession is the {noun}?",
                "To whom does the {noun} legally pertain?",
            ),
            kind="person",
        ),
    ),
)

TRAIN_SUBJECTS = (HOSPITAL, BRIDGE, FESTIVAL, MINE)
