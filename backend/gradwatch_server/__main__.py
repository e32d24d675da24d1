"""`python -m gradwatch_server` is the `gradwatch` command."""

import sys

from .cli import main

sys.exit(main())
