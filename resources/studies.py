"""Where hyperparameter studies are kept (`ml.tune`): storage their workers share."""

import dagster as dg
from pydantic import Field


class StudyStorage(dg.ConfigurableResource):
    """One Optuna storage for every use case's studies (a study's name starts with its use
    case's): a journal file on one machine, PostgreSQL for workers on several. It may carry a
    password: the production profile reads it through `EnvVar`, and it is shown without."""

    url: str = Field(
        description="journal:<file> (one machine: an append-only log under a file lock) or"
        " postgresql://user@host/db (several machines); plain SQLite is refused."
    )
