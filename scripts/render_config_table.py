"""Rewrite README.md's config table from pflash.config.config_table() (a test checks it)."""

from pathlib import Path

from pflash.config import config_table

BEGIN, END = "<!-- config-table:begin -->", "<!-- config-table:end -->"


def main() -> None:
    readme = Path(__file__).resolve().parents[1] / "README.md"
    text = readme.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{config_table().strip()}\n{END}{tail}")


if __name__ == "__main__":
    main()
