"""Plain Python, PyTorch and ONNX code of the lifecycle; never imports dagster."""
