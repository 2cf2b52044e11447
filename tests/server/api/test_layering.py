"""The HTTP layer calls services: no module of `api/` imports a Redis store (`txl_server.sessions.store`) or redis
itself (the runtime builds every service once, at start-up: runtime.py; the routes take them from it)."""

from __future__ import annotations

import ast
from pathlib import Path

import txl_server

PACKAGE = Path(txl_server.__file__).parent
API = PACKAGE / "api"


def imported(path: Path) -> set[str]:
    """The absolute names of the modules (or their members) `path` imports, relative imports resolved."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.split(".")[:-1]  # an __init__'s own package: its module is named `<package>.__init__`
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def test_the_api_imports_no_redis_store_and_no_redis():
    found = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in sorted(API.rglob("*.py"))
        for name in imported(path)
        if name.startswith(("txl_server.sessions.store.", "redis.")) or name == "redis"
    }
    assert found == set()


def test_imports_are_resolved_as_the_interpreter_does():
    # The check above must see a store import written relatively, as the API's modules write theirs.
    probe = API / "responses" / "serving.py"
    assert "txl_server.sessions.responses.ResponseTurns" in imported(probe)
    assert "txl_server.api.shared.limits.check_text" in imported(probe)
