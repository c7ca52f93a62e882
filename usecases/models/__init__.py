"""Networks a use case trains by import path, `model.architecture =
"usecases.models.residual_mlp:ResidualMLP"`: a team's own `torch.nn.Module`, following the
contract in `ml.model` (docs/training.md, "Models"). Not a use case: the one list of those is
`usecases.USE_CASES`. A team keeps its own network beside its declarations, in
`usecases/<name>/`, so that it ships with them to wherever training and export run."""
