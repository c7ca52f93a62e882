"""The kinds of task a model learns, and what differs between them.

- binary: the label is 0 or 1. The network outputs a logit, trained with binary cross-entropy;
  the served output is P(label = 1), `probability`, judged by ranking and calibration metrics at
  a decision threshold.
- regression: the label is a number. The network outputs the label standardized with the train
  split's mean and standard deviation, trained with the mean squared error; the served output
  undoes the standardization, `prediction`, in the label's units, judged by RMSE, MAE and R².
- multiclass: the label is one of a few classes (text or integers), learned as its index in the
  train split's sorted class names. The network outputs one logit per class, trained with
  cross-entropy; the served outputs are P(class) for every class, `probabilities` ([batch,
  classes], in the order of the class names), and the most probable class's name,
  `predicted_class`, judged by log loss, accuracy, macro F1 and per-class figures.

Each stage dispatches on a `Task` (the name in `DataConfig.task`); this module imports nothing
heavy, so serving can read it without torch.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    name: str
    output: str
    """The served graph's output, and the column of scored rows holding it."""
    meaning: str
    """What the output is, in words (the served graph's documentation)."""
    standardized_label: bool
    """Whether the network learns the label standardized with the train split's mean and
    standard deviation (and the served graph undoes it), rather than the label as it is."""
    loss_name: str
    """What the training and validation losses are."""
    slice_metric: str
    """The metric compared per slice and plotted per slice by default."""
    predicted: str | None = None
    """The served graph's second output, the predicted class's name (multiclass); None: the
    task serves `output` alone."""


BINARY = Task(
    name="binary",
    output="probability",
    meaning="P(label = 1)",
    standardized_label=False,
    loss_name="log loss",
    slice_metric="roc_auc",
)
REGRESSION = Task(
    name="regression",
    output="prediction",
    meaning="the label's predicted value, in the label's units",
    standardized_label=True,
    loss_name="mean squared error of the standardized label",
    slice_metric="rmse",
)
MULTICLASS = Task(
    name="multiclass",
    output="probabilities",
    meaning="P(class) for every class, in the order of the train split's sorted class names",
    standardized_label=False,
    loss_name="cross-entropy (multiclass log loss)",
    slice_metric="macro_f1",
    predicted="predicted_class",
)
TASKS = {task.name: task for task in (BINARY, REGRESSION, MULTICLASS)}


def task_named(name: str) -> Task:
    """The task called `name`; a ValueError naming the choices otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"task={name!r}: must be one of {tuple(TASKS)}") from None
