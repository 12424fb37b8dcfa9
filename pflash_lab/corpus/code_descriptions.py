"""Real stdlib functions described by what they do: the word resource of `described_code`
(`pflash_lab.corpus.nonliteral`).

Why hand-written: `code_retrieval` asks for a function by quoting its docstring, so a
lexical anchor finds it by string match. Here each function has descriptions of its
behaviour meant to share no content word with **anything in its source** (name, `def`
line, docstring, body identifiers): only understanding what the code does links the
question to it. `usable_descriptions` applies that rule (`pflash_lab.corpus.wording`) at
generation time, so a description that a later Python's source happens to share a word
with is dropped rather than trusted; the unit test checks that enough functions remain.
"""

from __future__ import annotations

from dataclasses import dataclass

from pflash_lab.corpus.wording import shared_words


@dataclass(frozen=True)
class FunctionDescription:
    """A stdlib function and descriptions of what it does, each a verb phrase that can
    follow "Which routine ... "."""

    module: str
    name: str
    descriptions: tuple[str, ...]


# A described-code question: one of these around one description.
CODE_QUESTION_FRAMES = (
    "Which routine shown above {description}? Answer with that routine alone.",
    "Of the routines above, which one {description}?",
    "One of the routines above {description}. Which is it?",
)


def usable_descriptions(desc: FunctionDescription, source: str) -> tuple[str, ...]:
    """The descriptions of `desc` that share no content word with `source` (the function's
    whole text) under any question frame."""
    return tuple(
        d
        for d in desc.descriptions
        if not any(shared_words(f.format(description=d), source) for f in CODE_QUESTION_FRAMES)
    )


DESCRIBED_FUNCTIONS = (
    FunctionDescription("textwrap", "shorten", (
        "abbreviates a passage to a size limit, squeezing runs of blanks into single gaps and "
        "ending it with a marker such as an ellipsis",
        "cuts a paragraph down at a gap between terms once it grows beyond a limit, tacking "
        "on a trailing marker",
    )),
    FunctionDescription("textwrap", "dedent", (
        "shifts each row of a block toward column zero by the amount of padding they all "
        "begin with",
        "undoes the uniform padding that each row of a multi-row block opens with",
    )),
    FunctionDescription("textwrap", "indent", (
        "puts a chosen marker string in front of each row of a block, optionally only for "
        "rows that a callback approves",
        "pushes every row of a passage rightward by putting a chosen marker in front of it, "
        "optionally skipping rows a callback rejects",
    )),
    FunctionDescription("calendar", "leapdays", (
        "counts the Februaries with an extra twenty-ninth from one starting annum up to, but "
        "not including, an ending annum",
        "tells how many intercalary-day periods fall between two bounds",
    )),
    FunctionDescription("calendar", "timegm", (
        "converts a broken-down UTC clock reading into the integer count elapsed since "
        "midnight on the first of January 1970",
        "acts as the inverse of gmtime, mapping a Greenwich-referenced struct onto an elapsed "
        "integer count since 1970",
    )),
    FunctionDescription("calendar", "weekday", (
        "reports for a given calendar entry whether it falls on a Monday, a Tuesday and so "
        "on, as an integer from zero to six",
        "works out which of the seven slots of a Monday-to-Sunday cycle a calendar entry "
        "lands on",
    )),
    FunctionDescription("fnmatch", "fnmatchcase", (
        "decides if a string fits a shell-style glob with stars and question marks, "
        "treating capitals and lowercase as distinct",
        "performs a wildcard comparison that treats capitals and lowercase as distinct "
        "letters",
    )),
    FunctionDescription("fnmatch", "filter", (
        "keeps only the strings of a collection that fit a shell-style wildcard",
        "selects, from many entries, just those a glob with stars and question marks accepts",
    )),
    FunctionDescription("glob", "has_magic", (
        "reports whether a string contains any wildcard symbol such as a star, a question "
        "mark or a bracket",
        "tells whether a pattern holds glob metacharacters",
    )),
    FunctionDescription("glob", "escape", (
        "neutralises the stars and question marks of a filesystem location so that a glob "
        "takes them at face value",
        "protects wildcard symbols in a location so a later glob treats them as plain",
    )),
    FunctionDescription("difflib", "get_close_matches", (
        "suggests the candidates that most resemble a misspelled term, provided they clear "
        "a threshold",
        "offers spelling suggestions: the few entries from a vocabulary that most resemble "
        "an input",
    )),
    FunctionDescription("difflib", "ndiff", (
        "produces a human-readable change report between a pair of multi-row texts, marking "
        "each row with plus or minus signs",
        "yields a report between a pair of texts in which each row is prefixed by a plus, "
        "a minus or a space",
    )),
    FunctionDescription("secrets", "token_hex", (
        "makes an unpredictable base-sixteen identifier suitable for passwords or session keys",
        "generates a cryptographically strong run of base-sixteen symbols, zero to nine and "
        "a to f",
    )),
    FunctionDescription("secrets", "randbelow", (
        "draws an unpredictable whole number from zero up to, but never reaching, a ceiling",
        "picks a cryptographically strong non-negative integer beneath a limit",
    )),
    FunctionDescription("secrets", "token_urlsafe", (
        "creates an unguessable key that can be placed in a web address without escaping",
        "makes a cryptographically strong identifier fit for links, such as for password "
        "resets",
    )),
    FunctionDescription("heapq", "nsmallest", (
        "picks the few lowest items of a collection, in ascending rank",
        "selects the bottom k entries of a collection, least ahead of the rest",
    )),
    FunctionDescription("heapq", "nlargest", (
        "picks the k biggest entries of a collection, biggest ahead of the rest",
        "selects the highest-ranked few items of a collection, in descending rank",
    )),
    FunctionDescription("heapq", "heapify", (
        "rearranges a collection where it lies so that its least item comes at position zero "
        "and each parent is no bigger than those beneath it",
        "reorders an array where it sits into a priority queue layout in linear work",
    )),
    FunctionDescription("os", "makedirs", (
        "builds a folder together with every missing parent folder on the way to it",
        "sets up a nested chain of folders in one call, the way the -p flag of the shell "
        "command does",
    )),
    FunctionDescription("os", "removedirs", (
        "deletes a vacant folder and then climbs upward deleting each parent that is left "
        "vacant too",
        "cleans up a chain of vacant folders from the bottom toward the root",
    )),
    FunctionDescription("os", "renames", (
        "relocates an item on disk to another location, building any missing parent folders "
        "at the destination and clearing out vacant ones at the origin",
        "moves something on disk elsewhere while building absent folders at the destination",
    )),
    FunctionDescription("posixpath", "expanduser", (
        "replaces a leading ~ in a location with the account's personal folder",
        "turns the squiggle prefix of a location into the login's own folder",
    )),
    FunctionDescription("posixpath", "expandvars", (
        "substitutes dollar-sign references in a location with the process's exported settings",
        "fills in the exported settings named with a dollar sign inside a location",
    )),
    FunctionDescription("posixpath", "relpath", (
        "computes how to reach one location from another directory, using dot-dot steps "
        "where necessary",
        "expresses a location as seen from a chosen base folder",
    )),
    FunctionDescription("posixpath", "splitext", (
        "separates a filename's suffix, such as .txt, from the rest",
        "breaks a location string into its stem and its dotted ending",
    )),
    FunctionDescription("genericpath", "samefile", (
        "tells if a pair of locations resolve to one identical inode on the disk",
        "checks if a pair of locations on disk are really one entry",
    )),
    FunctionDescription("linecache", "getline", (
        "fetches row n of a script, reading it from memory when it was loaded before",
        "hands back a numbered row of a script, served from an in-memory store",
    )),
    FunctionDescription("copy", "deepcopy", (
        "duplicates a value together with everything nested inside it, recursively",
        "builds a fully independent clone of a structure, cloning its children too",
    )),
    FunctionDescription("mimetypes", "guess_extension", (
        "suggests the dotted ending, such as .png, that suits a given media kind like "
        "image/png",
        "maps a content kind such as text/html to a usual suffix for saving it",
    )),
    FunctionDescription("stat", "filemode", (
        "renders access flags as the ls-style letters for read, write and execute",
        "turns an inode's access integer into the ten-letter drwx display that a folder "
        "listing prints",
    )),
    FunctionDescription("tarfile", "is_tarfile", (
        "checks whether a given location holds a tape-format bundle this module understands",
        "detects if something on disk is a tape-style bundle this module understands",
    )),
    FunctionDescription("zipfile", "is_zipfile", (
        "detects whether a location or stream holds a PKWARE-style compressed container",
        "tells if some bytes on disk form a valid pkzip bundle",
    )),
    FunctionDescription("tempfile", "mkdtemp", (
        "makes a fresh scratch folder with a random label and hands back where it lives",
        "sets up a private throwaway folder that whoever asked for it must clean up "
        "afterwards",
    )),
    FunctionDescription("uuid", "getnode", (
        "reports this machine's ethernet card MAC",
        "looks up the physical ethernet identifier of the host",
    )),
    FunctionDescription("warnings", "resetwarnings", (
        "wipes out every rule deciding how alerts get shown or suppressed",
        "empties the table of alert-handling rules",
    )),
    FunctionDescription("webbrowser", "open_new_tab", (
        "shows a web address next to those already visible in the usual surfing program, "
        "rather than in a separate window",
        "displays a link alongside those already visible in the user's web viewer",
    )),
    FunctionDescription("getpass", "getuser", (
        "looks up the login of whoever runs the process, checking several shell settings "
        "and then the system's account records",
        "tells which account launched the program",
    )),
    FunctionDescription("operator", "countOf", (
        "tallies how many occurrences of a value a container holds",
        "reports how often an element appears in a sequence",
    )),
    FunctionDescription("operator", "indexOf", (
        "tells the earliest position at which an element occurs in a container",
        "finds where an item sits in a container, complaining if it is absent",
    )),
    FunctionDescription("ast", "literal_eval", (
        "safely decodes written-out plain data (integers, pairs, mappings) into the objects "
        "they denote, refusing arbitrary code",
        "reads a representation of plain data without running arbitrary code",
    )),
    FunctionDescription("tokenize", "untokenize", (
        "rebuilds program text from a stream of lexical pieces",
        "reassembles a script from the lexer's pieces",
    )),
    FunctionDescription("shlex", "quote", (
        "protects an argument with apostrophes when needed so a command interpreter reads "
        "it literally",
        "makes a value safe to paste into a sh command line",
    )),
    FunctionDescription("shlex", "split", (
        "breaks a command line into its arguments the way a Unix interpreter would",
        "tokenises a sh-style command, honouring apostrophes and backslashes",
    )),
    FunctionDescription("colorsys", "rgb_to_hsv", (
        "converts red, green and blue intensities into hue, saturation and brightness",
        "maps an additive primary-colour triple onto the hue-saturation-brightness cone",
    )),
    FunctionDescription("colorsys", "hls_to_rgb", (
        "converts hue, lightness and saturation back into red, green and blue intensities",
        "maps a hue-lightness-saturation triple onto additive primary colours",
    )),
    FunctionDescription("bisect", "insort_right", (
        "places an element into an ordered sequence at the spot that preserves its order, "
        "after any equal elements",
        "places an entry into an ordered array without breaking its ordering, after any ties",
    )),
    FunctionDescription("pprint", "pformat", (
        "renders a value as a neatly laid-out str, breaking long containers over "
        "several rows",
        "produces a human-friendly multi-row display of nested data as a str",
    )),
    FunctionDescription("socket", "getfqdn", (
        "looks up the complete dotted label of a machine",
        "resolves a machine to its complete DNS label including the zone",
    )),
    FunctionDescription("subprocess", "getstatusoutput", (
        "launches an instruction line under the Bourne program and hands back the "
        "termination code plus everything it printed",
        "passes an instruction line to the Bourne program, giving both its termination "
        "code and what it printed",
    )),
    FunctionDescription("codecs", "make_identity_dict", (
        "builds a lookup in which each key points to itself",
        "creates a lookup table sending every number of a range to that same number",
    )),
    FunctionDescription("quopri", "needsquoting", (
        "tells if a character must be protected under the MIME seven-bit-safe transfer scheme",
        "tells if an octet has to be written as an equals-sign sequence in mail bodies",
    )),
    FunctionDescription("ipaddress", "collapse_addresses", (
        "merges adjacent and overlapping subnets into the fewest equivalent blocks",
        "reduces a group of subnets to the smallest covering collection of blocks",
    )),
)  # fmt: skip
