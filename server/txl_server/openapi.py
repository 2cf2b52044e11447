"""`python -m txl_server.openapi > docs/openapi.json`: the API's OpenAPI document (no model is loaded)."""

from __future__ import annotations

import json
import sys

from .api.app import create_app
from .settings import Settings


def main() -> None:
    spec = create_app(Settings()).openapi()
    json.dump(spec, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
