"""The repository's arrows point down: what imports what, read from the source.

- the product (`pflash/`, `deployments/`) never imports the lab (`pflash_lab/`: benchmark
  harness, trainers, corpora), not even lazily inside a function: the lab is not part of the
  installed distribution;
- nothing under `pflash/` imports Ray or the deployments: decisions stay testable without a
  cluster, and `deployments/` only carries;
- the edge (`pflash/serving/`) sits below the deployments and above the library: the CLI
  may import it, nothing else under `pflash/` does;
- no import cycle among the modules of `pflash/`, `deployments/` and `pflash_lab/`, lazy
  imports included (a cycle hidden in a function is still two modules that need each other);
- a product module over ~600 lines says why at its top;
- the distribution ships `pflash` and `deployments` only;
- the lab's commands reach it through the `pflash.commands` entry points, and where the lab
  is not importable each says so and how to get it;
- no two test modules share a file name: pytest imports them by basename (no packages under
  tests/), and a clash stops the whole run at collection.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP_PACKAGES = ("pflash", "deployments", "pflash_lab")
LAB_COMMANDS = ("bench", "calibrate", "head", "probe", "projection")
LONG_MODULE_LINES = 620


def _files(top: str) -> list[Path]:
    return sorted((ROOT / top).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module name an `import` or `from ... import` anywhere in the file names
    (relative imports resolved against the file's package)."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of this repository it imports. A name resolves to the longest
    module it starts with (`from pflash.spans import Span` is an edge to `pflash.spans`)."""
    paths = {_module_name(p): p for top in TOP_PACKAGES for p in _files(top)}

    def resolve(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in paths.items():
        targets = {resolve(n) for n in _imports(path)} - {None, module}
        graph[module] = targets
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_the_product_never_imports_the_lab():
    offenders = {
        str(path.relative_to(ROOT)): sorted(n for n in _imports(path) if _within(n, "pflash_lab"))
        for top in ("pflash", "deployments")
        for path in _files(top)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_library_imports_neither_ray_nor_the_deployments():
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if _within(n, "ray") or _within(n, "deployments")
        )
        for path in _files("pflash")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_the_layers_above_the_edge_import_it():
    above = ("pflash.serving", "pflash.cli")
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if _within(n, "pflash.serving")
        )
        for path in _files("pflash")
        if not any(_within(_module_name(path), layer) for layer in above)
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert "pflash.flow.compressor" in import_graph()["pflash.serving.gateway"]


def test_no_import_cycle_in_the_repository():
    graph = import_graph()
    assert (
        "pflash_lab.bench.suite" in graph and "pflash.spans" in graph["pflash.compress.render.chat"]
    )
    assert import_cycles(graph) == []


def test_the_cycle_check_finds_a_cycle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_long_product_modules_say_why_at_their_top():
    unexplained = []
    for path in _files("pflash"):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= LONG_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if "lines" not in doc:
            unexplained.append(str(path.relative_to(ROOT)))
    assert unexplained == []


def test_the_distribution_ships_the_product_and_registers_the_lab_commands():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert include == ["pflash", "pflash.*", "deployments", "deployments.*"]
    commands = project["project"]["entry-points"]["pflash.commands"]
    assert sorted(commands) == list(LAB_COMMANDS)
    assert all(target.startswith("pflash_lab.") for target in commands.values())


def test_pflash_bench_is_reached_through_the_registered_command(capsys):
    from pflash.cli import main

    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "run" in out and "smoke" in out and "ablate" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["probe", "train", "--help"], "--max-segment"),
        (["head", "train", "--help"], "--train-prompts"),
        (["projection", "train", "--help"], "--families"),
        (["calibrate", "--help"], "--validation-prompts"),
    ],
)
def test_the_trainers_are_reached_through_their_registered_commands(capsys, argv, expected):
    from pflash.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    assert expected in capsys.readouterr().out


def test_a_lab_command_without_the_lab_says_how_to_get_it(monkeypatch, capsys):
    from pflash.cli import main

    for name in [n for n in sys.modules if _within(n, "pflash_lab")] + ["pflash_lab"]:
        monkeypatch.setitem(sys.modules, name, None)  # None: the import system's "not found"
    assert main(["bench", "run", "--out", "somewhere"]) == 2
    err = capsys.readouterr().err
    assert "pflash bench:" in err and "scripts/setup.sh" in err and "pflash_lab" in err
    assert main(["probe", "train", "--help"]) == 2
    assert "pflash probe:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:  # the product's own commands are all there
        main(["plan", "--help"])
    assert done.value.code == 0


def test_no_two_test_modules_share_a_file_name():
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]}: pytest cannot collect both"
        seen[path.name] = path


def _design_rows() -> list[list[str]]:
    """The import picture of docs/DESIGN.md, top row first: each row's names as dotted
    module prefixes."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    start = text.index("**Import direction.**")
    block = text[
        text.index("```\n", start) + 4 : text.index("\n```", text.index("```\n", start) + 4)
    ]
    rows = []
    for line in block.splitlines():
        names = line.strip().split("   ")[0].split()
        if not names or names[0] == "│":
            continue
        dotted = [n.rstrip("/").replace("/", ".") for n in names]
        rows.append([n if n.split(".")[0] in TOP_PACKAGES else f"pflash.{n}" for n in dotted])
    return rows


def _row_of(module: str, rows: list[list[str]]) -> tuple[int, str] | None:
    best = None
    for i, row in enumerate(rows):
        for name in row:
            if _within(module, name) and (best is None or len(name) > len(best[1])):
                best = (i, name)
    return best


def test_the_design_picture_holds_every_import():
    """Every import of the repository points down the picture of docs/DESIGN.md, or stays
    within one name of a row (the models' three packages count as one)."""
    rows = _design_rows()
    assert len(rows) >= 8
    unplaced, upward = set(), []
    for module, targets in import_graph().items():
        here = _row_of(module, rows)
        if here is None:
            unplaced.add(module)
            continue
        for target in targets:
            there = _row_of(target, rows)
            if there is None:
                unplaced.add(target)
                continue
            same_name = here[1] == there[1] or (
                _within(here[1], "pflash.models") and _within(there[1], "pflash.models")
            )
            if there[0] < here[0] or (there[0] == here[0] and not same_name):
                upward.append(f"{module} -> {target}")
    assert upward == []
    assert unplaced <= {"pflash", "pflash_lab", "pflash_lab.commands", "pflash.commands"}
