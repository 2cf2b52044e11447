"""OpenAI's `service_tier`, as the OpenAI-compatible routes and the session steps take it and echo it.

A request may ask for `auto`, `default`, `flex` or `priority`; the response says the tier it was served in, as
OpenAI's does (`auto` and none are served as `default`). What each tier means here (admission.classes): priority
goes before its tenant's default work and is refused last; flex takes what interactive work leaves, is refused
first, and leaves the batch at a token boundary when default work needs the room.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

RequestedTier = Literal["auto", "default", "flex", "priority"]
ServedTier = Literal["default", "flex", "priority"]

SERVICE_TIER = Field(
    None,
    description="How to serve the request: auto (the server's choice: default), default, flex (slower, "
    "after default work, refused first under load) or priority (before the key's default work, refused last)",
)
SERVED_TIER = Field(None, description="The tier the request was served in")
