"""Dagster wiring of the ML lifecycle: definitions, partitions, jobs and automation.

Every process that loads this package (the code server, the daemon, a run's worker, `make run`)
keeps what `import dagster` made for its whole life: those objects are moved out of the cyclic
garbage collector's reach (`gc.freeze`), so that the collections that loading the definitions
(and later every run) triggers do not walk them again. A full collection over them is ~50 ms,
a fifth of what loading the definitions takes (docs/benchmarks.md, P1).
"""

import gc

import dagster  # noqa: F401  (its module objects live as long as the process: frozen below)

gc.freeze()
