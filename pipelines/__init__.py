"""Dagster wiring of the ML lifecycle: definitions, partitions, jobs and automation."""
