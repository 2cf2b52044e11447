"""The base of every request body's model: numbers as JSON Schema (and OpenAI's API) reads them.

pydantic's lax mode reads `true` as 1 and `false` as 0 (so `n: true` or `ttl_seconds: true` passed as 1), while
the OpenAPI document says integer or number, which a boolean is not. Strict mode would go too far the other way:
it refuses `1.0` for an integer, which JSON Schema counts as one. So a boolean is refused where a field takes a
number and no boolean, before the field's own validation (whose constraints stay in the document).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


class RequestBody(BaseModel):
    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            kinds = _kinds(cls.model_fields[info.field_name].annotation)
            if bool not in kinds and int in kinds:
                raise PydanticCustomError("int_type", "Input should be a valid integer")
            if bool not in kinds and float in kinds:
                raise PydanticCustomError("float_type", "Input should be a valid number")
        return value


def _kinds(annotation: Any) -> set[Any]:
    """The plain types a field's annotation takes (through Annotated, unions and Optional)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return set().union(*(_kinds(member) for member in typing.get_args(annotation)))
    return {annotation}
