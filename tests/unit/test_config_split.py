"""The whole config is taken only where it is loaded and split: the ingress's edge, the top of
the request flow, the in-process entry and the CLI. Every stage below them takes its
component (`SelectionConfig`, `GateConfig`, ...) or a small part (`CompressionPart`,
`ViewPart`, ...), so what a stage reads is what its signature says.

Read from the source: in `pflash/` outside `pflash/config/`, the parameters annotated with
`PFlashConfig`, and the class fields so annotated (a dataclass's field is a parameter of its
constructor)."""

from __future__ import annotations

import ast
from pathlib import Path

from pflash.config import AdmissionPart, CompressionPart, ViewPart, build_config
from pflash.views.keys import SELECTION_COMPONENTS

ROOT = Path(__file__).resolve().parents[2]
MOST_WHOLE_CONFIG_SIGNATURES = 8


def _names_whole_config(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "PFlashConfig":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "PFlashConfig":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "PFlashConfig" in node.value:  # a quoted annotation
                return True
    return False


def whole_config_signatures() -> list[str]:
    """`path:line name(parameter)` for every parameter or class field annotated with
    `PFlashConfig` in pflash/, outside the config package."""
    found = []
    config_package = ROOT / "pflash" / "config"
    for path in sorted((ROOT / "pflash").rglob("*.py")):
        if config_package in path.parents:
            continue
        where = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                name = getattr(node, "name", "lambda")
                found += [
                    f"{where}:{p.lineno} {name}({p.arg})"
                    for p in params
                    if p is not None and _names_whole_config(p.annotation)
                ]
            elif isinstance(node, ast.ClassDef):
                found += [
                    f"{where}:{field.lineno} {node.name}.{ast.unparse(field.target)}"
                    for field in node.body
                    if isinstance(field, ast.AnnAssign) and _names_whole_config(field.annotation)
                ]
    return found


def test_few_signatures_take_the_whole_config():
    found = whole_config_signatures()
    assert len(found) <= MOST_WHOLE_CONFIG_SIGNATURES, (
        f"{len(found)} signatures take the whole PFlashConfig (at most "
        f"{MOST_WHOLE_CONFIG_SIGNATURES}: where it is loaded and split); give a stage its "
        "component or a part (pflash/config/model.py):\n" + "\n".join(found)
    )


def test_the_scan_sees_parameters_fields_and_quoted_annotations():
    source = (
        "class Held:\n    config: PFlashConfig\n"
        "def f(a: 'PFlashConfig', *, b: config.PFlashConfig | None = None, c: int = 0): ...\n"
    )
    tree = ast.parse(source)
    function = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    params = [*function.args.args, *function.args.kwonlyargs]
    assert [_names_whole_config(p.annotation) for p in params] == [True, True, False]
    field = next(n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign))
    assert _names_whole_config(field.annotation)


def test_a_stage_given_its_part_reads_what_it_read_from_the_whole_config():
    """A part holds the config's own components (not copies), so every flat read and every
    derived value (`auto` resolved at load) is the whole config's."""
    config = build_config({"select_mode": "top_k", "select_topk": 3, "keep_ratio": 0.2}, env={})
    for part in (AdmissionPart, CompressionPart, ViewPart):
        held = config.part(part)
        for name in part.model_fields:
            assert getattr(held, name) is getattr(config, name)
        for key in part.component_of:
            assert getattr(held, key) == getattr(config, key)
    assert config.part(CompressionPart).selection.strict is config.strict is True
    # a view is reused under the digest of what compression reads: the view decision holds it
    assert set(SELECTION_COMPONENTS) <= set(ViewPart.model_fields)
    assert set(SELECTION_COMPONENTS) == set(CompressionPart.model_fields)
