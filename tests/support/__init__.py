"""Helpers shared by the tests and the benchmarks, one module per concern (each says what it
holds); pytest collects no tests here."""
