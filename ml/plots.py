"""Figures a person would rather look at than read, rendered to PNG bytes."""

import io


def loss_curve(train_loss: list[float], validation_loss: list[float], best_epoch: int) -> bytes:
    """Train and validation loss per epoch, the best epoch marked."""
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
        axes.set_ylabel("log loss")
        axes.legend()
        axes.grid(alpha=0.3)
        figure.tight_layout()
        out = io.BytesIO()
        figure.savefig(out, format="png")
        return out.getvalue()
    finally:
        plt.close(figure)
