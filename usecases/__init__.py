"""The use cases this project serves: each folder declares one data set and one prediction
(`declare.UseCase`), and the lifecycle builds every stage of each from its declaration.

A new use case is a folder here (laid out by `python -m cli.scaffold NAME`), its Feast
repository `feature_repo/<name>/`, and its line in `USE_CASES` below.
"""

from declare import UseCase
from usecases.flight_bands import USE_CASE as FLIGHT_BANDS
from usecases.flights import USE_CASE as FLIGHTS
from usecases.ridership import USE_CASE as RIDERSHIP

USE_CASES: tuple[UseCase, ...] = (FLIGHTS, RIDERSHIP, FLIGHT_BANDS)
"""Every declared use case, served side by side in one code location; the first is `make run`'s
default."""
BUNDLED: tuple[UseCase, ...] = (FLIGHTS, RIDERSHIP, FLIGHT_BANDS)
"""The use cases that come with the project, their data with them. One added later (by
`python -m cli.scaffold`) joins `USE_CASES` only: the generic modules are checked against
the bundled ones' names, not against the ordinary words (`user`, `timestamp`) of a new data set."""
