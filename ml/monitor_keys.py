"""The names the monitoring stages (`ml.monitor`) and the retrain sensors share: the stages'
checks, and the metadata keys by which a materialization records an event and the model version
it judged. Pandas-free: the sensors import it when the definitions load.
"""

DRIFT_CHECK = "drift_within_thresholds"
REALIZED_CHECK = "realized_within_tested"
DRIFT_EVENT = "drift_event"
"""Metadata key of `feature_drift` materializations: true when the window drifted."""
DECAY_EVENT = "decay_event"
"""Metadata key of `realized_performance` materializations: true when the window's realized
figure is worse than the model's tested one by more than the configured drop."""
CHAMPION_VERSION = "champion_version"
"""Metadata key: the model version judged: whose reference the window was compared with
(`feature_drift`), or which made the predictions (`realized_performance`)."""
CHAMPION_DATA_THROUGH = "champion_data_through"
"""Metadata key: the last day of that version's training data ("" when not recorded)."""
