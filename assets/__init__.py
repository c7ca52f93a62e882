"""Assets of the lifecycle, one module per stage; thin glue around ml/ and the resources."""

import dagster as dg

EXTERNAL_RETRY = dg.RetryPolicy(
    max_retries=2, delay=5, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)
"""For steps that talk to another system (the drop folder or object store, the Feast registry and
stores, the MLflow server): a dropped connection or a busy database usually passes within
seconds, so two more tries, 5 s and then ~10 s later. Bad data is never retried: those steps
raise `dg.Failure(allow_retries=False)`, which a retry policy does not repeat."""
