"""Exit codes of a training process that a scheduler acts on (`ml.node`, `ml.train`)."""

EXIT_NOT_RETRYABLE = 78
"""A bad configuration or input (sysexits' EX_CONFIG): retrying cannot help."""
