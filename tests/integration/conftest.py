"""Whole training runs against servers that fail on purpose, timed: `make test` runs them alone,
after the parallel tests, on a quieter machine."""

from support.tiers import folder_tier

#: Every test here is of the `integration` tier (tests/support/tiers.py).
pytest_itemcollected = folder_tier("integration")
