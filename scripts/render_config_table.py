"""Rewrite the generated configuration tables (a test checks both are current):
docs/CONFIGURATION.md's full table from pflash.config.config_table() and README.md's
"Knobs you will change" from pflash.config.knobs_table()."""

from pathlib import Path

from pflash.config import config_table, knobs_table

ROOT = Path(__file__).resolve().parents[1]
# file, marker name, generator
TABLES = (
    (ROOT / "docs" / "CONFIGURATION.md", "config-table", config_table),
    (ROOT / "README.md", "knobs-table", knobs_table),
)


def replace_between(text: str, marker: str, body: str) -> str:
    """`text` with what lies between `<!-- marker:begin -->` and `<!-- marker:end -->` replaced."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body.strip()}\n{end}{tail}"


def main() -> None:
    for path, marker, table in TABLES:
        path.write_text(replace_between(path.read_text(), marker, table()))


if __name__ == "__main__":
    main()
