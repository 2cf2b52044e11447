"""deploy/docker-compose.yml: valid against the Compose Specification's schema (vendored), and wired as the
deployment needs: secrets required, a GPU reserved, Redis persistent, settings that exist."""

from __future__ import annotations

import copy
import json
from functools import cache

import pytest
import yaml
from txl_server.settings import Settings

from .files import DEPLOY, MissingVariable, interpolate, required_variables

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a dev dependency")

COMPOSE = DEPLOY / "docker-compose.yml"
SECRETS = {"TXL_API_KEYS", "GRAFANA_ADMIN_PASSWORD"}
DUMMY_ENV = {name: f"dummy-{name.lower()}" for name in SECRETS}


@cache
def raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def compose() -> dict:
    """The file as `docker compose config` sees it, with dummy values for the required secrets."""
    return interpolate(copy.deepcopy(raw()), DUMMY_ENV)


@cache
def validator():
    schema = json.loads((DEPLOY / "schemas" / "compose-spec.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def schema_errors(document: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(document)]


def test_compose_file_is_valid_against_the_compose_spec():
    assert schema_errors(compose()) == []


def _unknown_top_level_key(doc):
    doc["servics"] = doc.pop("services")


def _gpu_count_typo(doc):
    doc["services"]["txl"]["deploy"]["resources"]["reservations"]["devices"][0]["cnt"] = 1


def _volumes_as_string(doc):
    doc["services"]["redis"]["volumes"] = "redis-data:/data"


def _gpu_without_capabilities(doc):
    del doc["services"]["txl"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"]


def _port_as_mapping(doc):
    doc["services"]["txl"]["ports"] = {"8000": 8000}


@pytest.mark.parametrize(
    "mutate",
    [
        _unknown_top_level_key,
        _gpu_count_typo,
        _volumes_as_string,
        _gpu_without_capabilities,
        _port_as_mapping,
    ],
)
def test_compose_schema_rejects_a_broken_copy(mutate):
    document = compose()
    mutate(document)
    assert schema_errors(document), f"{mutate.__name__} should not validate"


def test_required_secrets_fail_fast_when_unset():
    assert required_variables(raw()) == SECRETS
    for missing in SECRETS:
        env = {k: v for k, v in DUMMY_ENV.items() if k != missing}
        with pytest.raises(MissingVariable, match=missing):
            interpolate(raw(), env)
    text = COMPOSE.read_text()
    for name in SECRETS:
        assert f"${{{name}:?" in text  # unset *or empty* fails, with the message after :?


def test_server_reserves_one_nvidia_gpu():
    devices = compose()["services"]["txl"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]


def test_server_environment_uses_the_compose_redis_and_real_settings():
    doc = compose()
    env = doc["services"]["txl"]["environment"]
    assert env["TXL_REDIS_URL"] == "redis://redis:6379/0" and "redis" in doc["services"]
    assert env["TXL_PERSISTENCE"] == "always"
    assert env["TXL_HOST"] == "0.0.0.0"
    assert env["TXL_DEVICE"] == "cuda" and env["TXL_DTYPE"] == "bfloat16"
    assert env["TXL_API_KEYS"] == DUMMY_ENV["TXL_API_KEYS"]
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}  # (tests/deploy/test_tracing.py)
    fields = set(Settings.model_fields)
    for key in env:
        assert key.removeprefix("TXL_").lower() in fields, f"{key} is not a setting (it would be ignored)"
    # The values parse as settings, e.g. the persistence mode and the dtype.
    Settings(**{k.removeprefix("TXL_").lower(): v for k, v in env.items()})
    assert doc["services"]["txl"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_server_health_check_hits_ready_on_the_container_port():
    service = compose()["services"]["txl"]
    test = service["healthcheck"]["test"]
    assert test == [
        "CMD",
        "python",
        "-m",
        "txl_server.healthcheck",
        "--path",
        "/ready",
    ]  # finds the port itself
    assert any(str(p).endswith(":" + service["environment"]["TXL_PORT"]) for p in service["ports"])


def test_a_start_up_error_is_not_retried_for_ever():
    """The server exits 2 on what only the operator can fix (tests/server/test_device_check.py); compose retries a
    failure a few times and then leaves the container down (tests/deploy/test_docker_image.py runs the policy)."""
    policy = compose()["services"]["txl"]["restart"]
    kind, _, retries = policy.partition(":")
    assert kind == "on-failure" and 1 <= int(retries) <= 5, policy
    assert interpolate(raw(), {**DUMMY_ENV, "TXL_RESTART": "unless-stopped"})["services"]["txl"][
        "restart"
    ] == ("unless-stopped")


def test_redis_keeps_an_append_only_file_on_a_named_volume():
    doc = compose()
    redis = doc["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    volume, _, target = redis["volumes"][0].partition(":")
    assert target == "/data" and volume in doc["volumes"]


def test_images_are_pinned():
    for name, service in compose()["services"].items():
        image = service["image"]
        _, _, tag = image.rpartition(":")
        assert tag and tag != "latest" and any(c.isdigit() for c in tag), f"{name}: {image}"


def test_bind_mounted_config_files_exist():
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith(".") and "models" not in source:
                assert (COMPOSE.parent / source).exists(), f"{name}: {source} is missing"
