"""Whole training runs against servers that fail on purpose. A module whose assertions time
something declares `pytestmark = pytest.mark.timed`: `make test` runs those alone, after the
parallel tests, on a quieter machine; the others (what was lost, stored or exported, whatever the
timing) run with the parallel tests."""

from support.tiers import folder_tier

#: Every test here is of the `integration` tier (tests/support/tiers.py).
pytest_itemcollected = folder_tier("integration")
