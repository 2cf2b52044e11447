"""deploy/k8s: every manifest valid against the Kubernetes schemas (offline, from the kubernetes-validate
package), CRDs against the vendored subset schema, and wired as the deployment needs."""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from pathlib import Path

import pytest
import yaml
from txl_server.settings import Settings

from .files import DEPLOY, parse_dockerfile
from .nginx import SESSION_MAP, parse_maps, strip_comments

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is a dev dependency (it bundles the schemas)"
)
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a dev dependency")

K8S = DEPLOY / "k8s"
# The oldest Kubernetes these manifests support, and the newest the installed package knows.
VERSIONS = ["1.29.0", kubernetes_validate.utils.latest_version()]
# Custom resources are not in the core schemas: each allowed one is checked against a vendored schema.
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): DEPLOY / "schemas" / "servicemonitor-v1.subset.json"
}


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


@cache
def documents() -> list[tuple[str, dict]]:
    out = []
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((str(path.relative_to(K8S)), doc))
    return out


def find(kind: str, name: str | None = None, docs: list[tuple[str, dict]] | None = None) -> dict:
    docs = documents() if docs is None else docs
    found = [d for _, d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def validate(doc: dict, version: str) -> None:
    """Raises jsonschema.ValidationError (or kubernetes_validate's errors) when `doc` is invalid."""
    key = (doc["apiVersion"], doc["kind"])
    if key in CRD_SCHEMAS:
        schema = json.loads(CRD_SCHEMAS[key].read_text())
        jsonschema.Draft202012Validator(schema).validate(doc)
    else:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid(version):
    assert documents()
    for path, doc in documents():
        try:
            validate(doc, version)
        except Exception as exc:
            pytest.fail(f"{path}: {doc['kind']}/{doc['metadata']['name']} is invalid for {version}: {exc}")


def _deployment_unknown_field(docs):
    find("Deployment", docs=docs)["spec"]["replica"] = 2  # strict mode rejects fields the API does not have


def _port_not_a_number(docs):
    container = find("Deployment", docs=docs)["spec"]["template"]["spec"]["containers"][0]
    container["ports"][0]["containerPort"] = "http"


def _gpu_limit_not_a_quantity(docs):
    container = find("Deployment", docs=docs)["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["limits"]["nvidia.com/gpu"] = {"count": 1}


def _service_monitor_typo(docs):
    monitor = find("ServiceMonitor", docs=docs)
    monitor["spec"]["endpoint"] = monitor["spec"].pop("endpoints")


@pytest.mark.parametrize(
    "mutate",
    [_deployment_unknown_field, _port_not_a_number, _gpu_limit_not_a_quantity, _service_monitor_typo],
)
def test_validation_rejects_a_broken_copy(mutate):
    broken = copy.deepcopy(documents())
    mutate(broken)
    errors = []
    for _, doc in broken:
        try:
            validate(doc, VERSIONS[0])
        except Exception as exc:
            errors.append(exc)
    assert errors, f"{mutate.__name__} should not validate"


def test_kustomizations_apply_every_manifest_once():
    listed: list[Path] = []
    for kustomization in K8S.rglob("kustomization.yaml"):
        config = yaml.safe_load(kustomization.read_text())
        assert config["kind"] == "Kustomization" and config["namespace"] == "txl"
        for resource in config["resources"]:
            path = (kustomization.parent / resource).resolve()
            assert path.is_file(), f"{kustomization}: {resource} is missing"
            listed.append(path)
    assert len(listed) == len(set(listed))
    # The ingress-nginx snippet belongs to the controller's namespace and is applied by hand (docs/deploy.md).
    expected = {p.resolve() for p in manifest_files() if p.parent.name != "ingress-nginx"}
    assert set(listed) == expected


def server_container() -> dict:
    (container,) = find("Deployment", "txl-server")["spec"]["template"]["spec"]["containers"]
    return container


def test_deployment_requests_a_gpu_per_pod():
    resources = server_container()["resources"]
    assert str(resources["limits"]["nvidia.com/gpu"]) == "1"


def test_probes_hit_health_and_ready_on_the_container_port():
    container = server_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    runtime = parse_dockerfile().stage("runtime")
    image_cmd = runtime.last("CMD")
    assert image_cmd is not None and container["args"] == image_cmd.exec_form()
    assert ports["http"] == int(container["args"][container["args"].index("--port") + 1])
    for probe, path in (
        ("livenessProbe", "/health"),
        ("readinessProbe", "/ready"),
        ("startupProbe", "/health"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert ports.get(get["port"], get["port"]) == ports["http"], probe


def test_api_keys_come_from_a_secret():
    container = server_container()
    env = {e["name"]: e for e in container["env"]}
    ref = env["TXL_API_KEYS"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == "txl-api-keys" and ref["key"]
    config = find("ConfigMap", "txl-config")["data"]
    assert "TXL_API_KEYS" not in config
    assert not [d for _, d in documents() if d["kind"] == "Secret"], "no secret values in the repo"


def test_config_holds_real_settings_and_points_at_the_redis_service():
    config = find("ConfigMap", "txl-config")["data"]
    fields = set(Settings.model_fields)
    for key in config:
        assert key.removeprefix("TXL_").lower() in fields, f"{key} is not a setting (it would be ignored)"
    Settings(**{k.removeprefix("TXL_").lower(): v for k, v in config.items()})
    assert config["TXL_PERSISTENCE"] == "always"  # any replica may serve any session
    envfrom = server_container()["envFrom"]
    assert {"configMapRef": {"name": "txl-config"}} in envfrom
    host, port = re.match(r"redis://([^:/]+):(\d+)/\d+$", config["TXL_REDIS_URL"]).groups()
    service = find("Service", host)
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]


def test_redis_statefulset_keeps_an_append_only_file_on_a_volume_claim():
    redis = find("StatefulSet", "txl-redis")
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    claims = {c["metadata"]["name"] for c in redis["spec"]["volumeClaimTemplates"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts.get("data") == "/data" and "data" in claims
    assert redis["spec"]["serviceName"] == "txl-redis"


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_services_monitor_and_ingress_reach_the_server_pods():
    pod_labels = find("Deployment", "txl-server")["spec"]["template"]["metadata"]["labels"]
    service = find("Service", "txl-server")
    assert _selects(service["spec"]["selector"], pod_labels)
    port_names = {p["name"] for p in service["spec"]["ports"]}
    monitor = find("ServiceMonitor")
    assert _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("http", "/metrics")]
    assert "http" in port_names
    (rule,) = find("Ingress")["spec"]["rules"]
    for path in rule["http"]["paths"]:
        backend = path["backend"]["service"]
        assert backend["name"] == "txl-server" and backend["port"]["name"] in port_names


def controller_snippet() -> str:
    return find("ConfigMap", "ingress-nginx-controller")["data"]["http-snippet"]


def test_ingress_hashes_on_the_session_variable_the_controller_snippet_defines():
    annotations = find("Ingress")["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$txl_session"
    assert "txl_session" in parse_maps(controller_snippet())


def test_the_controller_snippet_is_the_proxy_session_map_line_for_line():
    """One source of the routing key: the ingress-nginx snippet and deploy/nginx's standalone proxy (which
    tests/deploy/test_nginx.py runs for real) hold the same maps; tests/deploy/test_nginx_config.py checks what
    they compute for every route."""
    assert strip_comments(controller_snippet()) == strip_comments(SESSION_MAP.read_text())
