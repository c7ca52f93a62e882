"""Figures a person would rather look at than read, rendered to PNG bytes."""

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import numpy as np

from ml.metrics import (
    METRICS,
    CalibrationBin,
    Evaluation,
    MulticlassMetrics,
    SliceMetrics,
    binary_metrics,
    class_indices,
    roc_curve,
)
from ml.task import BINARY, task_named

SCATTER_POINTS = 5_000
"""Points drawn per series in a scatter plot: a seeded sample of the rows beyond that."""


def loss_curve(
    train_loss: list[float],
    validation_loss: list[float],
    best_epoch: int,
    loss_name: str = BINARY.loss_name,
) -> bytes:
    """Train and validation loss per epoch, the best epoch marked; `loss_name` labels the axis
    (`ml.task.Task.loss_name`)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    from matplotlib import pyplot as plt

    epochs = range(1, len(train_loss) + 1)
    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
    try:
        axes.plot(epochs, train_loss, marker="o", label="train")
        axes.plot(epochs, validation_loss, marker="o", label="validation")
        axes.axvline(best_epoch, color="grey", linestyle="--", label=f"best (epoch {best_epoch})")
        axes.set_xlabel("epoch")
        axes.set_ylabel(loss_name)
        axes.legend()
        axes.grid(alpha=0.3)
        figure.tight_layout()
        out = io.BytesIO()
        figure.savefig(out, format="png")
        return out.getvalue()
    finally:
        plt.close(figure)


def warm_up() -> None:
    """Import matplotlib and draw a throwaway figure with text (loading the fonts), so that a
    process's first real figure costs only its own drawing: for a thread to run while the
    process waits on something else."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(1, 1), dpi=10)
    try:
        axes.set_xlabel("x")
        _png(figure)
    finally:
        plt.close(figure)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    from matplotlib import pyplot as plt

    return plt


def _png(figure: Any) -> bytes:
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()


def roc_curves(curves: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> bytes:
    """ROC curve of each named (labels, probabilities) pair, its AUC in the legend."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(5, 5), dpi=100)
    try:
        for name, (labels, probabilities) in curves.items():
            labels = np.asarray(labels)
            if 0 < labels.sum() < len(labels):
                fpr, tpr = roc_curve(labels, probabilities)
                auc = binary_metrics(labels, probabilities).roc_auc
                axes.plot(fpr, tpr, label=f"{name} (AUC {auc:.3f})")
            else:
                axes.plot([], [], label=f"{name} (one class only: no curve)")
        axes.plot([0, 1], [0, 1], color="grey", linestyle="--", label="chance")
        axes.set_xlabel("false positive rate")
        axes.set_ylabel("true positive rate")
        axes.set_xlim(0, 1)
        axes.set_ylim(0, 1)
        axes.legend(loc="lower right")
        axes.grid(alpha=0.3)
        return _png(figure)
    finally:
        plt.close(figure)


def calibration_plot(curves: Mapping[str, list[CalibrationBin]]) -> bytes:
    """Reliability diagram: observed rate against mean probability per bin, and the diagonal of
    perfect calibration."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(5, 5), dpi=100)
    try:
        axes.plot([0, 1], [0, 1], color="grey", linestyle="--", label="perfectly calibrated")
        for name, bins in curves.items():
            axes.plot(
                [b.mean_probability for b in bins],
                [b.observed_rate for b in bins],
                marker="o",
                label=name,
            )
        axes.set_xlabel("mean predicted probability")
        axes.set_ylabel("observed positive rate")
        axes.set_xlim(0, 1)
        axes.set_ylim(0, 1)
        axes.legend(loc="upper left")
        axes.grid(alpha=0.3)
        return _png(figure)
    finally:
        plt.close(figure)


def class_bars(evaluations: Mapping[str, Evaluation], figure_name: str = "recall") -> bytes:
    """A multiclass model's per-class `figure_name` (recall, precision or F1), a bar per class for
    each named evaluation (the challenger, the champion), the class's test rows under it."""
    per_class = {}
    for name, evaluation in evaluations.items():
        overall = evaluation.overall
        if not isinstance(overall, MulticlassMetrics):
            raise ValueError(f"{name}: a {evaluation.task} evaluation has no per-class figures")
        per_class[name] = overall.per_class
    first = next(iter(per_class.values()), ())
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(max(5, 1.2 * len(first) + 2), 3.5), dpi=100)
    try:
        width = 0.8 / max(len(per_class), 1)
        x = np.arange(len(first))
        for i, (name, classes) in enumerate(per_class.items()):
            axes.bar(x + i * width, [getattr(c, figure_name) for c in classes], width, label=name)
        axes.set_xticks(
            x + width * (len(per_class) - 1) / 2, [f"{c.name}\nn={c.support:,}" for c in first]
        )
        axes.set_ylabel(figure_name)
        axes.set_ylim(0, 1)
        axes.legend(loc="upper right")
        axes.grid(axis="y", alpha=0.3)
        return _png(figure)
    finally:
        plt.close(figure)


def confusion_matrix(
    labels: np.ndarray, probabilities: np.ndarray, classes: Sequence[str]
) -> bytes:
    """Rows per (class, predicted class), each row's share of its class shaded and written in
    its cell: where a multiclass model's mistakes go."""
    indices = class_indices(labels, classes)
    predicted = np.asarray(probabilities).argmax(axis=1)
    counts = np.zeros((len(classes), len(classes)), dtype="int64")
    np.add.at(counts, (indices, predicted), 1)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    plt = _pyplot()
    size = max(4, 0.9 * len(classes) + 2)
    figure, axes = plt.subplots(figsize=(size, size), dpi=100)
    try:
        axes.imshow(shares, cmap="Blues", vmin=0, vmax=1)
        for (row, column), count in np.ndenumerate(counts):
            shade = "white" if shares[row, column] > 0.5 else "black"
            text = f"{shares[row, column]:.0%}\n{count:,}"
            axes.text(column, row, text, ha="center", va="center", color=shade, fontsize=8)
        axes.set_xticks(range(len(classes)), classes, rotation=45, ha="right")
        axes.set_yticks(range(len(classes)), classes)
        axes.set_xlabel("predicted class")
        axes.set_ylabel("class")
        return _png(figure)
    finally:
        plt.close(figure)


def slice_bars(
    challenger: Evaluation,
    champion: Evaluation | None,
    metric: str | None = None,
    intervals: Mapping[tuple[str, str], tuple[float, float]] | None = None,
) -> bytes:
    """One panel per slice, a bar per value of `metric` (by default the task's
    `slice_metric`: ROC AUC, or RMSE) for the challenger and, beside it, the champion; under each
    value its test rows (`n=`), so a small slice reads as one; skipped values have no bar and
    "(skipped)" under their name. `intervals` ((slice, value) → (low, high), of the challenger's
    `metric`: `ml.realized.slice_intervals`) are drawn as error bars on the challenger's bars."""
    kind = METRICS[challenger.task]
    metric = metric or task_named(challenger.task).slice_metric
    if metric not in {f.name for f in fields(kind)}:
        raise ValueError(f"metric={metric!r}: not a field of {kind.__name__}")
    names = list(dict.fromkeys(s.slice for s in challenger.slices))
    plt = _pyplot()
    figure, panels = plt.subplots(
        max(len(names), 1), 1, figsize=(8, 2.8 * max(len(names), 1)), dpi=100, squeeze=False
    )
    try:
        if not names:
            panels[0, 0].text(0.5, 0.5, "no slices evaluated", ha="center", va="center")
            panels[0, 0].set_axis_off()
        width = 0.4 if champion is not None else 0.8
        for axes, name in zip(panels[: len(names), 0], names, strict=True):
            ours = [s for s in challenger.slices if s.slice == name]
            x = np.arange(len(ours))
            heights = [_value(s, metric) for s in ours]
            axes.bar(x, heights, width, label="challenger")
            if intervals:
                spans = [intervals.get((s.slice, s.value), (math.nan, math.nan)) for s in ours]
                lows, highs = (np.array(side, dtype="float64") for side in zip(*spans, strict=True))
                drawn = np.array(heights, dtype="float64")
                below = np.clip(np.nan_to_num(drawn - lows, nan=0.0), 0, None)
                above = np.clip(np.nan_to_num(highs - drawn, nan=0.0), 0, None)
                axes.errorbar(
                    x,
                    heights,
                    yerr=[below, above],
                    fmt="none",
                    ecolor="black",
                    capsize=3,
                    linewidth=1,
                    label="95% interval",
                )
            if champion is not None:
                theirs = {(s.slice, s.value): s for s in champion.slices}
                axes.bar(
                    x + width,
                    [_value(theirs.get((s.slice, s.value)), metric) for s in ours],
                    width,
                    label="champion",
                )
            axes.set_xticks(
                x + (width / 2 if champion is not None else 0),
                [
                    f"{s.value}\nn={s.rows:,}" + ("" if s.metrics is not None else "\n(skipped)")
                    for s in ours
                ],
                rotation=45 if len(ours) > 8 else 0,
                fontsize=8,
            )
            axes.set_title(name)
            axes.set_ylabel(metric)
            axes.grid(axis="y", alpha=0.3)
            axes.legend(fontsize=8)
            if all(s.metrics is None for s in ours):
                axes.set_yticks([])
                why = "every value skipped: too few test rows, or a single class or label value"
                axes.text(0.5, 0.5, why, transform=axes.transAxes, ha="center", va="center")
        return _png(figure)
    finally:
        plt.close(figure)


def realized_over_time(history: Sequence[Mapping], tested: float | None, metric: str) -> bytes:
    """Realized `metric` per measured day (`ml.realized` documents, in order): each day's figure
    with its bootstrap interval as a point, its trailing window's as a line in its band, and the
    model's tested figure as a dashed line."""
    days = [str(document["partition"]) for document in history]
    day = _figures([document["day"]["overall"] for document in history])
    window = _figures([document["trailing_window"]["overall"] for document in history])
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 3.5), dpi=100)
    try:
        x = np.arange(len(days))
        axes.errorbar(
            x, day[0], yerr=[day[0] - day[1], day[2] - day[0]], fmt="o", capsize=3, label="day"
        )
        axes.plot(x, window[0], color="tab:orange", label="trailing window")
        axes.fill_between(x, window[1], window[2], color="tab:orange", alpha=0.2)
        if tested is not None and math.isfinite(tested):
            axes.axhline(tested, color="grey", linestyle="--", label=f"tested ({tested:.3f})")
        axes.set_xticks(x, [d[5:] for d in days], rotation=45 if len(days) > 10 else 0, fontsize=7)
        axes.set_ylabel(metric)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        return _png(figure)
    finally:
        plt.close(figure)


def folds_over_time(by_config: Mapping[str, Sequence[Mapping]], baseline: str | None) -> bytes:
    """A backtest's metric per fold (the `ml.backtest.FoldResult` documents of each catalog
    entry, by its `config`, in fold order): each entry's figure with its bootstrap interval, a
    line per entry, and the naive forecast's figure per fold (the same rows whichever entry)
    dashed. An undefined figure (None) is left out."""
    documents = [d for results in by_config.values() for d in results]
    folds = sorted({str(d["fold"]) for d in documents})
    at = {fold: i for i, fold in enumerate(folds)}
    metric = str(documents[0]["metric"]) if documents else "metric"
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 3.5), dpi=100)
    try:
        forecast: dict[str, float] = {}
        for n, (config, results) in enumerate(sorted(by_config.items())):
            shift = (n - (len(by_config) - 1) / 2) * 0.08
            x = np.array([at[str(d["fold"])] for d in results]) + shift
            value, low, high = (
                np.array([math.nan if d[k] is None else d[k] for d in results], dtype="float64")
                for k in ("value", "low", "high")
            )
            axes.errorbar(
                x, value, yerr=[value - low, high - value], fmt="o-", capsize=3, label=config
            )
            forecast |= {
                str(d["fold"]): d["baseline"] for d in results if d["baseline"] is not None
            }
        if forecast:
            shown = sorted(forecast)
            axes.plot(
                [at[f] for f in shown],
                [forecast[f] for f in shown],
                color="grey",
                linestyle="--",
                marker="x",
                label=f"naive forecast ({baseline})",
            )
        axes.set_xticks(range(len(folds)), [f[:7] for f in folds], fontsize=7,
                        rotation=45 if len(folds) > 8 else 0)  # fmt: skip
        axes.set_xlabel("fold (the month tested)")
        axes.set_ylabel(metric)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        return _png(figure)
    finally:
        plt.close(figure)


def realized_slices(rows: Sequence[Mapping], tested: float | None, metric: str) -> bytes:
    """One panel per slice: realized `metric` per value with its bootstrap interval (rows as
    `ml.realized` reports them), the model's tested figure as a dashed line."""
    names = list(dict.fromkeys(str(row["slice"]) for row in rows))
    plt = _pyplot()
    figure, panels = plt.subplots(
        max(len(names), 1), 1, figsize=(8, 2.6 * max(len(names), 1)), dpi=100, squeeze=False
    )
    try:
        for axes, name in zip(panels[:, 0], names, strict=False):
            ours = [row for row in rows if row["slice"] == name]
            value, low, high = _figures(ours)
            x = np.arange(len(ours))
            axes.bar(x, value, yerr=[value - low, high - value], capsize=3)
            if tested is not None and math.isfinite(tested):
                axes.axhline(tested, color="grey", linestyle="--", label="tested")
                axes.legend(fontsize=8)
            labels = [f"{row['group']}\n({row['rows']})" for row in ours]
            axes.set_xticks(x, labels, rotation=45 if len(ours) > 8 else 0, fontsize=7)
            axes.set_title(name)
            axes.set_ylabel(metric)
            axes.grid(axis="y", alpha=0.3)
        return _png(figure)
    finally:
        plt.close(figure)


def _figures(measured: Sequence[Mapping]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values, lows and highs of measured figures; NaN where undefined (not drawn)."""

    def column(name: str) -> np.ndarray:
        return np.array(
            [m[name] if m[name] is not None else math.nan for m in measured], dtype="float64"
        )

    return column("value"), column("low"), column("high")


def _value(found: SliceMetrics | None, metric: str) -> float:
    """NaN (no bar) when the slice was skipped or is absent."""
    if found is None or found.metrics is None:
        return math.nan
    return getattr(found.metrics, metric)


def predicted_vs_actual(curves: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> bytes:
    """Predicted against actual value of each named (labels, predictions) pair, the diagonal
    of perfect predictions drawn (at most `SCATTER_POINTS` rows of each, a seeded sample)."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(5, 5), dpi=100)
    try:
        low, high = math.inf, -math.inf
        for name, (labels, predictions) in curves.items():
            actual, predicted = _sample(np.asarray(labels), np.asarray(predictions))
            axes.scatter(actual, predicted, s=4, alpha=0.3, label=name)
            if len(actual):
                low = min(low, float(actual.min()), float(predicted.min()))
                high = max(high, float(actual.max()), float(predicted.max()))
        if low <= high:
            axes.plot([low, high], [low, high], color="grey", linestyle="--", label="perfect")
        axes.set_xlabel("actual")
        axes.set_ylabel("predicted")
        axes.legend(loc="upper left")
        axes.grid(alpha=0.3)
        return _png(figure)
    finally:
        plt.close(figure)


def residuals(curves: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> bytes:
    """Residual (prediction - label) against prediction for each named (labels, predictions)
    pair (at most `SCATTER_POINTS` rows of each, a seeded sample), and beside it a histogram of
    every residual."""
    plt = _pyplot()
    figure, (scatter, histogram) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    try:
        errors = {
            name: np.asarray(predictions, dtype="float64") - np.asarray(labels, dtype="float64")
            for name, (labels, predictions) in curves.items()
        }
        edges = np.histogram_bin_edges(np.concatenate([np.zeros(0), *errors.values()]), bins=50)
        for name, (_, predictions) in curves.items():
            shown_errors, shown_predictions = _sample(errors[name], np.asarray(predictions))
            scatter.scatter(shown_predictions, shown_errors, s=4, alpha=0.3, label=name)
            histogram.hist(errors[name], bins=edges, histtype="step", label=name)
        scatter.axhline(0, color="grey", linestyle="--")
        scatter.set_xlabel("predicted")
        scatter.set_ylabel("residual (predicted - actual)")
        histogram.axvline(0, color="grey", linestyle="--")
        histogram.set_xlabel("residual (predicted - actual)")
        histogram.set_ylabel("rows")
        for axes in (scatter, histogram):
            axes.legend(fontsize=8)
            axes.grid(alpha=0.3)
        return _png(figure)
    finally:
        plt.close(figure)


def _sample(*columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """The same seeded sample of at most `SCATTER_POINTS` rows of each column."""
    rows = len(columns[0])
    if rows <= SCATTER_POINTS:
        return columns
    picked = np.random.default_rng(0).choice(rows, size=SCATTER_POINTS, replace=False)
    return tuple(column[picked] for column in columns)


def drift_bars(
    psi: Mapping[str, float], levels: Mapping[str, str], warn: float, fail: float
) -> bytes:
    """PSI per column, worst at the top, coloured by level, the two thresholds as lines (the
    axis is logarithmic: drifts range over four orders of magnitude)."""
    colours = {"ok": "tab:green", "warn": "tab:orange", "fail": "tab:red"}
    names = sorted(psi, key=lambda n: psi[n] if math.isfinite(psi[n]) else math.inf)
    values = [max(psi[n], 1e-4) if math.isfinite(psi[n]) else 1e3 for n in names]
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 0.22 * len(names) + 1.2), dpi=100)
    try:
        axes.barh(range(len(names)), values, color=[colours[levels[n]] for n in names])
        axes.set_yticks(range(len(names)), [n.split("__")[-1] for n in names], fontsize=7)
        axes.set_xscale("log")
        axes.axvline(warn, color="tab:orange", linestyle="--", label=f"warn (PSI {warn:g})")
        axes.axvline(fail, color="tab:red", linestyle="--", label=f"fail (PSI {fail:g})")
        axes.set_xlabel("population stability index vs the training reference")
        axes.legend(fontsize=8, loc="lower right")
        axes.grid(axis="x", alpha=0.3)
        figure.tight_layout()
        return _png(figure)
    finally:
        plt.close(figure)


def training_telemetry(
    epochs: Sequence[int],
    samples_per_s: Mapping[str, Sequence[float]],
    data_wait_fraction: Mapping[str, Sequence[float]],
    memory_mib: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    memory_names: tuple[str, str] = ("peak", "now"),
) -> bytes:
    """Three panels over the epochs, a line per named series (the job, each rank), each series
    in one colour throughout: samples/s, the share of time spent waiting for data, and memory in
    MiB (peak solid, now dashed, as `memory_names` call them) (`ml.telemetry.plot`)."""
    plt = _pyplot()
    from matplotlib.ticker import PercentFormatter

    named = dict.fromkeys([*samples_per_s, *data_wait_fraction, *memory_mib])
    colours = {name: f"C{i}" for i, name in enumerate(named)}
    figure, panels = plt.subplots(3, 1, figsize=(6, 8), dpi=100, sharex=True)
    try:
        speed, wait, memory = panels
        for axes, series in ((speed, samples_per_s), (wait, data_wait_fraction)):
            for name, values in series.items():
                axes.plot(epochs, values, marker="o", color=colours[name], label=name)
        for name, (peak, now) in memory_mib.items():
            colour = colours[name]
            memory.plot(epochs, peak, marker="o", color=colour, label=f"{name} {memory_names[0]}")
            memory.plot(
                epochs,
                now,
                marker=".",
                linestyle="--",
                color=colour,
                label=f"{name} {memory_names[1]}",
            )
        speed.set_ylabel("samples/s")
        speed.set_ylim(bottom=0)
        wait.set_ylabel("waiting for data")
        wait.yaxis.set_major_formatter(PercentFormatter(xmax=1))
        wait.set_ylim(bottom=0)
        memory.set_ylabel("memory (MiB)")
        memory.set_ylim(bottom=0)
        memory.set_xlabel("epoch")
        memory.set_xticks(list(epochs))
        for axes in panels:
            axes.grid(alpha=0.3)
            axes.legend(fontsize=7)
        return _png(figure)
    finally:
        plt.close(figure)


def optimization_history(values: Sequence[tuple[int, float]]) -> bytes:
    """A study's completed trials, (number, validation loss) in order: each trial's loss as a
    point and the best so far as a step line."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
    try:
        numbers = [number for number, _ in values]
        losses = np.array([loss for _, loss in values], dtype=float)
        axes.plot(numbers, losses, "o", label="trial")
        axes.step(numbers, np.minimum.accumulate(losses), where="post", label="best so far")
        axes.set_xlabel("trial")
        axes.set_ylabel("validation loss")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        return _png(figure)
    finally:
        plt.close(figure)


def importances(shares: Mapping[str, float]) -> bytes:
    """Each searched setting's importance, as Optuna's default evaluator (PED-ANOVA) measures
    it, largest on top."""
    ordered = sorted(shares.items(), key=lambda item: item[1])
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6, 0.5 + 0.4 * len(ordered)), dpi=100)
    try:
        axes.barh([name for name, _ in ordered], [share for _, share in ordered])
        axes.set_xlabel("importance (PED-ANOVA)")
        axes.grid(alpha=0.3, axis="x")
        return _png(figure)
    finally:
        plt.close(figure)
