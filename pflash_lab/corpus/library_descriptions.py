"""Functions of a third-party library (Jinja2) described by what they do: the word resource of
`described_library_code` (`pflash_lab.corpus.nonliteral`).

Why a second source: the stdlib functions of `described_code` are the code every other code
family reads too, and their names are mostly split by underscores. Jinja2 is a hard
dependency of the product (`pyproject.toml`), pure Python, and none of its files is in any
other family; its names run words together (`do_filesizeformat`, `do_striptags`,
`test_sameas`), its docstrings are short or full of template examples, and several of its
functions say what they do only in their body. As in `pflash_lab.corpus.code_descriptions`,
each description is meant to share no content word with anything in the function's source,
and `usable_descriptions` drops at generation time one that a later Jinja2 release happens to
share a word with.
"""

from __future__ import annotations

from pflash_lab.corpus.code_descriptions import FunctionDescription

LIBRARY_PACKAGE = "jinja2"

# module is the file's stem inside the package
LIBRARY_FUNCTIONS = (
    FunctionDescription("tests", "test_boolean", (
        "tells whether something is exactly one of the two logic constants, yes or no",
        "answers whether an argument is precisely one of the pair of truth constants",
    )),
    FunctionDescription("tests", "test_integer", (
        "checks that something is a whole number while refusing the two truth constants, "
        "which would otherwise pass",
        "answers whether an argument is a counting number but neither yes nor no",
    )),
    FunctionDescription("tests", "test_mapping", (
        "answers whether an argument is a lookup table from keys to entries",
        "tells whether something behaves like an associative array of keys",
    )),
    FunctionDescription("tests", "test_sequence", (
        "probes an argument by asking its size and its subscript hook, answering no on any "
        "failure",
        "checks that something has a size and supports indexing by position",
    )),
    FunctionDescription("tests", "test_sameas", (
        "compares two arguments by identity rather than equality",
        "answers whether two references denote one identical thing, not merely equal ones",
    )),
    FunctionDescription("tests", "test_iterable", (
        "tells whether something can be looped over by attempting to obtain a walker for it",
        "answers yes when a for loop could walk through an argument, no when asking "
        "for its walker fails",
    )),
    FunctionDescription("utils", "consume", (
        "drains a stream completely, throwing every element away",
        "walks through a generator to its end while discarding whatever it yields",
    )),
    FunctionDescription("utils", "open_if_exists", (
        "hands back a readable handle on a location when a regular disk entry sits "
        "there, nothing else",
        "checks for a regular disk entry at a location and, when present, gives a handle "
        "on it in binary reading style",
    )),
    FunctionDescription("utils", "object_type_repr", (
        "produces a readable label naming the class of something, with special "
        "wording for a couple of unique constants",
        "describes what kind of thing an argument is, including its package, for messages",
    )),
    FunctionDescription("utils", "url_quote", (
        "percent-escapes a value so it can go into a web address, optionally turning "
        "blanks into plus signs",
        "prepares a value for a web address by percent escaping its characters",
    )),
    FunctionDescription("utils", "clear_caches", (
        "empties the memoized stores kept for tokenizers and ad hoc configurations, "
        "releasing RAM",
        "wipes memoization so that RAM figures begin afresh",
    )),
    FunctionDescription("utils", "import_string", (
        "locates a Python thing given its location written with periods or a "
        "separator sign, loading whatever package is needed",
        "resolves a textual location such as os.sep into the actual thing it names, "
        "optionally yielding nothing when that goes wrong",
    )),
    FunctionDescription("utils", "generate_lorem_ipsum", (
        "makes up placeholder blocks of Latin-looking filler prose with punctuation "
        "sprinkled at random",
        "invents dummy Latin filler prose, block by block, for page mockups",
    )),
    FunctionDescription("utils", "htmlsafe_json_dumps", (
        "encodes data as JS notation and swaps angle brackets, ampersands and "
        "apostrophes for backslash sequences so a web page can embed it",
    )),
    FunctionDescription("filters", "do_forceescape", (
        "neutralises angle brackets and ampersands in some text unconditionally, even "
        "when that means doing so twice",
    )),
    FunctionDescription("filters", "do_capitalize", (
        "puts the initial letter of some text in majuscule and all the rest in small type",
        "makes only the leading letter of some text a majuscule, putting everything "
        "after it in minuscules",
    )),
    FunctionDescription("filters", "do_title", (
        "gives every term of some text a leading majuscule and minuscules after it",
        "turns some text into headline casing, each term opening with a majuscule",
    )),
    FunctionDescription("filters", "do_filesizeformat", (
        "renders an amount of storage as kilo, tera and so on for people, in powers "
        "of ten or of two",
        "turns a raw amount of storage into a friendly figure with a suffix such as kB",
    )),
    FunctionDescription("filters", "do_int", (
        "turns something into a whole figure, falling back to a preset figure when "
        "that goes wrong, accepting hexadecimal or octal notation",
    )),
    FunctionDescription("filters", "do_striptags", (
        "removes angle-bracket elements from some text and collapses runs of blanks "
        "into a single gap",
        "cleans angle-bracket elements out of a web page fragment, leaving plain prose",
    )),
    FunctionDescription("filters", "do_batch", (
        "groups a stream into chunks of a fixed size, padding the last chunk when asked",
        "cuts a sequence into consecutive groups of n elements each, padding the final "
        "group when asked",
    )),
    FunctionDescription("filters", "sync_do_slice", (
        "divides elements into a chosen count of roughly equal groups, padding the "
        "shorter ones when asked",
        "spreads elements over k groups of nearly equal size, for laying them out side "
        "by side",
    )),
    FunctionDescription("filters", "do_reverse", (
        "flips the order of a sequence or text backwards",
        "produces a back-to-front version of text or any collection",
    )),
    FunctionDescription("filters", "do_round", (
        "approximates a figure to some digits after the point, upward, downward or to "
        "the nearest",
    )),
    FunctionDescription("sandbox", "safe_range", (
        "builds an arithmetic progression of integers but refuses one that would be "
        "too long, to protect a restricted interpreter",
        "creates a numeric span as the builtin does yet refuses one exceeding a cap",
    )),
    FunctionDescription("sandbox", "modifies_known_mutable", (
        "tells whether invoking a given method on a standard container would change it "
        "in place",
    )),
    FunctionDescription("lexer", "count_newlines", (
        "tallies the line breaks contained in some text",
        "says how many line breaks occur inside text",
    )),
    FunctionDescription("runtime", "markup_join", (
        "glues pieces together, switching to a web-aware gluing as soon as one piece "
        "is already trusted for web pages",
    )),
    FunctionDescription("environment", "create_cache", (
        "builds a memo store whose kind depends on a limit: nothing for zero, an "
        "unbounded table for negative, else a least-recently-used store",
    )),
    FunctionDescription("environment", "copy_cache", (
        "makes a blank memo store of the same kind and limit as an existing one",
    )),
    FunctionDescription("compiler", "has_safe_repr", (
        "decides whether a constant, possibly nested in containers, can be written back "
        "as source literally",
    )),
)  # fmt: skip
