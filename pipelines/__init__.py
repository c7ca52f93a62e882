"""Dagster wiring of the ML lifecycle: definitions, partitions, jobs and automation, and the run
launcher's health check (`run_health`). The commands people type are `cli/`, above it."""
