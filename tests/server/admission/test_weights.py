"""The weights of fair share as an operator sets them (TXL_TENANT_WEIGHTS): by tenant id, the key's SHA-256
prefix the server names a tenant by; checked when the settings are read."""

from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError
from txl_server.api.shared.auth import ApiKeys
from txl_server.settings import Settings


def test_a_keys_tenant_id_takes_its_weight_and_the_others_weigh_one():
    tenant = hashlib.sha256(b"heavy-key").hexdigest()[:32]
    settings = Settings(api_keys="heavy-key,light-key", tenant_weights=f"{tenant}=3, anonymous=0.5")
    keys = ApiKeys.from_settings(settings)
    weight = settings.tenant_weight
    assert weight(keys.tenant("Bearer heavy-key")) == 3.0
    assert weight(keys.tenant("Bearer light-key")) == 1.0 and weight("anonymous") == 0.5


@pytest.mark.parametrize(
    "text", ["heavy=2", "0123456789abcdef0123456789abcdef=0", "0123456789abcdef0123456789abcdef"]
)
def test_weights_that_are_not_tenant_id_and_positive_weight_are_refused(text):
    with pytest.raises(ValidationError, match="tenant_weights"):
        Settings(tenant_weights=text)
