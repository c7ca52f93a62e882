"""The tags Dagster writes on a materialization to record its versions and inputs.

A step that reports several partitions' materializations itself (a batched range) writes them
as Dagster would for one; `make lineage` reads them back. Dagster keeps these names in a private
module, so they are spelled here, once.
"""

DATA_VERSION_TAG = "dagster/data_version"
CODE_VERSION_TAG = "dagster/code_version"
INPUT_VERSION_TAG = "dagster/input_data_version/"
"""Followed by the input asset's key (`<use case>/raw_<table>`)."""
INPUT_POINTER_TAG = "dagster/input_event_pointer/"
"""Followed by the input asset's key: the storage id of the input's materialization."""
