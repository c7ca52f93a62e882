"""Feast extensions of the project: the DuckDB ASOF JOIN offline store."""
