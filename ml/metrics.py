"""Quality of a binary classifier's probabilities on one split."""

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class BinaryMetrics:
    rows: int
    positive_rate: float
    """Share of rows whose label is 1, as a fraction."""
    log_loss: float
    roc_auc: float
    """NaN when the split holds one class only."""
    average_precision: float
    brier: float
    accuracy: float
    """At a 0.5 threshold, as a fraction."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def binary_metrics(labels: np.ndarray, probabilities: np.ndarray) -> BinaryMetrics:
    """Metrics of P(label = 1) against 0/1 labels; refuses NaN or out-of-range probabilities."""
    from sklearn import metrics

    labels = np.asarray(labels, dtype="float64")
    probabilities = np.asarray(probabilities, dtype="float64")
    if len(labels) != len(probabilities) or len(labels) == 0:
        raise ValueError(f"{len(labels)} labels for {len(probabilities)} probabilities")
    bad = int((~np.isfinite(probabilities) | (probabilities < 0) | (probabilities > 1)).sum())
    if bad:
        raise ValueError(f"{bad} probabilities are NaN, infinite or outside [0, 1]")
    both_classes = 0 < labels.sum() < len(labels)
    return BinaryMetrics(
        rows=len(labels),
        positive_rate=float(labels.mean()),
        log_loss=float(metrics.log_loss(labels, probabilities, labels=[0, 1])),
        roc_auc=float(metrics.roc_auc_score(labels, probabilities)) if both_classes else math.nan,
        average_precision=(
            float(metrics.average_precision_score(labels, probabilities))
            if both_classes
            else math.nan
        ),
        brier=float(metrics.brier_score_loss(labels, probabilities)),
        accuracy=float(((probabilities >= 0.5) == labels).mean()),
    )
