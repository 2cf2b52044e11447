"""Times in answers: Unix times in whole seconds, read from the float times the services keep."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BeforeValidator

Seconds = Annotated[int, BeforeValidator(int)]
# An expiry rounded up: a client that waits until then finds it expired.
SecondsUp = Annotated[int, BeforeValidator(math.ceil)]
