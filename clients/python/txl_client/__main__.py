"""`python -m txl_client`: the `txl` command line."""

import sys

from .cli import main

sys.exit(main())
