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
from prometheus_client import generate_latest
from txl_client import calls
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
# Custom resources are not in the core schemas: each allowed one is checked against a vendored schema, a JSON
# schema or the custom resource definition itself (deploy/schemas/README.md).
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): DEPLOY / "schemas" / "servicemonitor-v1.subset.json",
    ("inference.networking.k8s.io/v1", "InferencePool"): DEPLOY / "schemas" / "inferencepool-v1.crd.yaml",
}


@cache
def crd_schema(path: Path, version: str) -> dict:
    """The JSON schema of a vendored schema file: a JSON schema as it is, or a CustomResourceDefinition's
    openAPIV3Schema for `version`, made strict as the API server's strict field validation is (an object with
    `properties` takes no others unless it preserves unknown fields). CEL rules (x-kubernetes-validations) are
    not checked."""
    if path.suffix == ".json":
        return json.loads(path.read_text())
    crd = yaml.safe_load(path.read_text())
    assert crd["kind"] == "CustomResourceDefinition"
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return _strict(copy.deepcopy(served["schema"]["openAPIV3Schema"]))


def _strict(node):
    if isinstance(node, dict):
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)
    return node


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
        schema = crd_schema(CRD_SCHEMAS[key], doc["apiVersion"].rpartition("/")[2])
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


def _inference_pool_typo(docs):
    pool = find("InferencePool", docs=docs)
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")


def _inference_pool_port_out_of_range(docs):
    find("InferencePool", docs=docs)["spec"]["targetPorts"][0]["number"] = 80000


def _inference_pool_bad_failure_mode(docs):
    find("InferencePool", docs=docs)["spec"]["endpointPickerRef"]["failureMode"] = "Open"


@pytest.mark.parametrize(
    "mutate",
    [
        _deployment_unknown_field,
        _port_not_a_number,
        _gpu_limit_not_a_quantity,
        _service_monitor_typo,
        _inference_pool_typo,
        _inference_pool_port_out_of_range,
        _inference_pool_bad_failure_mode,
    ],
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
    config = {k: v for k, v in find("ConfigMap", "txl-config")["data"].items() if not k.startswith("OTEL_")}
    fields = set(Settings.model_fields)  # (OpenTelemetry's own variables: tests/deploy/test_tracing.py)
    for key in config:
        assert key.removeprefix("TXL_").lower() in fields, f"{key} is not a setting (it would be ignored)"
    Settings(**{k.removeprefix("TXL_").lower(): v for k, v in config.items()})
    assert config["TXL_PERSISTENCE"] == "always"  # any replica may serve any session
    envfrom = server_container()["envFrom"]
    assert {"configMapRef": {"name": "txl-config"}} in envfrom
    hosts, master = re.match(r"redis\+sentinel://([^/]+)/(\w+)$", config["TXL_REDIS_URL"]).groups()
    sentinels = find("StatefulSet", "txl-sentinel")
    service = sentinels["spec"]["serviceName"]
    expected = [
        f"{sentinels['metadata']['name']}-{i}.{service}:26379" for i in range(sentinels["spec"]["replicas"])
    ]
    assert hosts.split(",") == expected
    assert 26379 in [p["port"] for p in find("Service", service)["spec"]["ports"]]
    scripts = find("ConfigMap", "txl-redis-scripts")["data"]
    assert f"sentinel monitor {master} " in scripts["sentinel.sh"]


def test_three_redis_with_three_sentinels_keep_append_only_files_and_never_evict():
    redis = find("StatefulSet", "txl-redis")
    assert redis["spec"]["replicas"] == 3 and find("StatefulSet", "txl-sentinel")["spec"]["replicas"] == 3
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    script = find("ConfigMap", "txl-redis-scripts")["data"]["redis.sh"]
    assert container["command"] == ["sh", "/scripts/redis.sh"]
    for setting in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert setting in script, setting
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


def test_the_inference_pool_selects_the_server_pods_on_their_api_port():
    pool = find("InferencePool", "txl-server")["spec"]
    pod_labels = find("Deployment", "txl-server")["spec"]["template"]["metadata"]["labels"]
    assert _selects(pool["selector"]["matchLabels"], pod_labels)
    ports = {p["name"]: p["containerPort"] for p in server_container()["ports"]}
    assert [p["number"] for p in pool["targetPorts"]] == [ports["http"]]
    assert pool["endpointPickerRef"]["name"] == "txl-epp"


def picker_config() -> dict:
    (text,) = find("ConfigMap", "txl-epp-config")["data"].values()
    return yaml.safe_load(text)


def exported_metrics() -> dict[str, set[str]]:
    """{metric name: its label names} of what a server's /metrics offers once its engine runs."""
    from prometheus_client.parser import text_string_to_metric_families
    from txl import BlockPool, TransfoXLLMHeadModel, TxlConfig
    from txl_server.metrics import Metrics

    model = TransfoXLLMHeadModel(TxlConfig.tiny(vocab_size=256, cutoffs=[], div_val=1, n_layer=1))
    metrics = Metrics()
    metrics.watch_pool(BlockPool(model.memory_layout(), block_size=16, blocks=8))
    metrics.on_queue(0, 0)
    text = generate_latest(metrics.registry).decode()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_the_endpoint_picker_reads_metrics_the_server_offers():
    """The picker's engine config (llm-d Router's core-metrics-extractor) names TXL's gauges with the meaning it
    expects, the info metric carries the labels it reads, and its session affinity reads the SDK's header."""
    config = picker_config()
    assert config["kind"] == "EndpointPickerConfig"
    plugins = {p.get("name", p["type"]): p for p in config["plugins"]}
    extractor = plugins["core-metrics-extractor"]["parameters"]
    (engine,) = [e for e in extractor["engineConfigs"] if e["name"] == extractor["defaultEngine"]]
    offered = exported_metrics()
    for field in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec"):
        assert engine[field] in offered, (field, engine[field])
    assert {"block_size", "num_gpu_blocks"} <= offered[engine["cacheInfoSpec"]]
    affinity = plugins["session-affinity-scorer"]["parameters"]
    assert affinity["strategy"] == "session_id"
    assert [s["header"] for s in affinity["sessionIdConfig"]["sources"]] == [calls.SESSION_HEADER.lower()]
    for profile in config["schedulingProfiles"]:
        for ref in profile["plugins"]:
            assert ref["pluginRef"] in plugins, ref
    for ref in config["requestHandler"]["parsers"]:
        assert ref["pluginRef"] in plugins, ref
