"""The diagnostics corpus: real training scripts (corpus/), one process each, against a server."""

from support.tiers import folder_tier

#: Every test here is of the `corpus` tier (tests/support/tiers.py).
pytest_itemcollected = folder_tier("corpus")
