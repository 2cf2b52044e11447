"""API keys: each key is a tenant. Keys are kept only as SHA-256 digests and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from ...errors import Unauthorized
from ...settings import Settings

ANONYMOUS = "anonymous"  # the single tenant when no keys are configured


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def hash_key(key: str) -> str:
    """The line to put in a keys file for `key` (so the file never holds the key itself)."""
    return "sha256:" + _digest(key).hex()


class ApiKeys:
    def __init__(self, digests: list[bytes]) -> None:
        self._digests = digests

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        digests = []
        if settings.api_keys is not None:
            digests += [
                _digest(k.strip()) for k in settings.api_keys.get_secret_value().split(",") if k.strip()
            ]
        if settings.api_keys_file is not None:
            for line in Path(settings.api_keys_file).read_text(encoding="utf-8").splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                if line.startswith("sha256:"):
                    digests.append(bytes.fromhex(line.removeprefix("sha256:")))
                else:
                    digests.append(_digest(line))
        return cls(digests)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def tenant(self, authorization: str | None) -> str:
        """The tenant id for an `Authorization: Bearer <key>` header, or Unauthorized."""
        if not self.enabled:
            return ANONYMOUS
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized("missing API key: send `Authorization: Bearer <key>`")
        presented = _digest(key.strip())
        match: bytes | None = None
        for digest in self._digests:  # no early exit: the same work whichever key (if any) matches
            if hmac.compare_digest(presented, digest):
                match = digest
        if match is None:
            raise Unauthorized("invalid API key")
        return match.hex()[:32]
