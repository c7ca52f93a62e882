"""The commands people type: `make run` (`python -m cli.run`), `make lineage`
(`python -m cli.lineage`), the scaffold of a new use case (`python -m cli.scaffold`), the names
file of a Feast repository (`python -m cli.feast_names`) and the supervisor `make dev` runs
`dagster dev` under (`python -m cli.stops`). They sit above the
Dagster wiring (`pipelines/`), which never imports them."""
