"""The networks a use case can train, chosen by `model.architecture` (`build_model`):

- `mlp`: `TabularNet`, an MLP over the numbers and one embedding per categorical column;
- `ft_transformer`: `FTTransformer`, a transformer over one token per feature (Gorishniy et al.,
  "Revisiting Deep Learning Models for Tabular Data", 2021), as wide and deep as
  `model.token_dim` and `model.num_blocks` say;
- `package.module:ClassName`: a team's own `torch.nn.Module` (`team_model`).

The contract every network keeps, built-in or not: it is built from the preprocessor's shapes
and the task, `numeric_width` (standardized numbers, then one missing flag per number),
`cardinalities` (a vocabulary size per categorical column, index 0 = unknown) and `outputs` (1,
or one per class); `forward(numeric, categorical)` takes float32 (batch, numeric_width) and int64
(batch, len(cardinalities)) and returns (batch,) when outputs == 1, else (batch, outputs): a
logit for a binary task, the standardized label for regression (`ml.task`). It must trace into
ONNX with torch's TorchScript-based exporter (`ml.export`), so no Python branch on a tensor's
values. A team's class is constructed with those three keyword arguments, plus `options` (a
dict) when `model.options` is set.

Sharding: `shard_units` names the parts of a network that FSDP shards one by one (each its own
`fully_shard`, gathered only while it runs): a network's `shard_units()` method when it has one,
else its `blocks` (an `nn.ModuleList`) when it has them, else none (the network is sharded
whole). The transformer's units are its blocks, the MLP's its linear layers.
"""

import importlib
import inspect
import math
from typing import Any

import torch
from torch import nn

from ml.config import ModelConfig, network_options, team_network

MLP = "mlp"
FT_TRANSFORMER = "ft_transformer"
CHECK_ROWS = 2
"""Rows of the dummy batch a team's network is checked with (`check_network`)."""


def build_model(
    numeric_width: int, cardinalities: list[int], outputs: int, config: ModelConfig
) -> nn.Module:
    """The network `config.architecture` names, for inputs of the preprocessor's shapes
    (`numeric_width` columns, one vocabulary size per categorical column) and `outputs` outputs
    per row (1, or the number of classes)."""
    if config.architecture == MLP:
        return TabularNet(numeric_width, cardinalities, config, outputs)
    if config.architecture == FT_TRANSFORMER:
        return FTTransformer(numeric_width, cardinalities, config, outputs)
    return team_model(config, numeric_width, cardinalities, outputs)


class Offset(nn.Module):
    """A regression network that corrects a forecast among its inputs: numeric input `index`
    (that forecast, standardized as a feature) mapped into the label's standardized units,
    `scale` * x + `shift`, plus `gain` times `net`'s output. `gain` is learned and starts at 0
    (as ReZero's residual weights do), so training starts from the forecast itself and moves
    away from it only as far as the loss says. A missing forecast is imputed to the feature's
    mean (0 standardized), so there the forecast is that mean. The mapping is two constants
    (buffers), traced into ONNX with the rest."""

    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(self, net: nn.Module, index: int, scale: float, shift: float) -> None:
        super().__init__()
        self.net = net
        self.index = index
        self.gain = nn.Parameter(torch.zeros(1))  # one element, not a scalar: FSDP shards dim 0
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))
        self.register_buffer("shift", torch.tensor(shift, dtype=torch.float32))

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        forecast = numeric[:, self.index] * self.scale + self.shift
        return forecast + self.gain * self.net(numeric, categorical)

    def shard_units(self) -> list[nn.Module]:
        """The wrapped network's units."""
        return shard_units(self.net)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The submodules FSDP shards one by one (module docstring): `model.shard_units()` when it
    defines it, else the modules of `model.blocks` when that is an `nn.ModuleList`, else none."""
    method = getattr(model, "shard_units", None)
    if callable(method):
        units: list[nn.Module] = list(method())  # type: ignore[call-overload]
        return units
    blocks = getattr(model, "blocks", None)
    return list(blocks) if isinstance(blocks, nn.ModuleList) else []


def embedding_dim(cardinality: int, max_dim: int) -> int:
    """Width of a category's embedding: grows with the square root of its vocabulary."""
    return min(max_dim, math.ceil(math.sqrt(cardinality)) + 1)


class TabularNet(nn.Module):
    """An MLP over the numbers and one embedding per categorical column."""

    def __init__(
        self,
        numeric_width: int,
        cardinalities: list[int],
        config: ModelConfig,
        outputs: int = 1,
    ):
        super().__init__()
        dims = [embedding_dim(n, config.max_embedding_dim) for n in cardinalities]
        self.embeddings = nn.ModuleList(
            nn.Embedding(n, d) for n, d in zip(cardinalities, dims, strict=True)
        )
        width = numeric_width + sum(dims)
        layers: list[nn.Module] = []
        for hidden in config.hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(config.dropout)]
            width = hidden
        layers.append(nn.Linear(width, outputs))
        self.mlp = nn.Sequential(*layers)
        self.outputs = outputs

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        embedded = [e(categorical[:, i]) for i, e in enumerate(self.embeddings)]
        out = self.mlp(torch.cat([numeric, *embedded], dim=1))
        return out.squeeze(1) if self.outputs == 1 else out

    def shard_units(self) -> list[nn.Module]:
        """None: the root is its one unit, one gather and one reduce-scatter a step. Each unit
        costs a gather before its forward and its backward and a reduce-scatter, and on gloo
        those outweigh an MLP's arithmetic: its layers as a unit of their own took 14.3 ms a
        step against the root alone's 9.4 ms (docs/benchmarks.md, P13)."""
        return []


class FTTransformer(nn.Module):
    """A feature tokenizer and transformer: every number becomes a token (its value times a
    learned vector, plus its missing flag times another, plus a learned bias), every categorical
    column one (its category's embedding plus a learned bias); a learned [CLS] token joins them;
    `num_blocks` pre-norm transformer blocks (`blocks`) mix them, and a head (LayerNorm, ReLU,
    Linear) reads the [CLS] token. As in the paper, the first block does not normalize its input
    (the tokens are fresh) and there is no dropout on the residual branches."""

    def __init__(
        self,
        numeric_width: int,
        cardinalities: list[int],
        config: ModelConfig,
        outputs: int = 1,
    ):
        super().__init__()
        dim = config.token_dim
        self.tokenizer = FeatureTokenizer(numeric_width, cardinalities, dim)
        self.cls = _token_parameter(1, dim)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                dim,
                config.num_heads,
                config.ffn_hidden,
                attention_dropout=config.attention_dropout,
                ffn_dropout=config.dropout,
                normalize_input=i > 0,
            )
            for i in range(config.num_blocks)
        )
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.ReLU(), nn.Linear(dim, outputs))
        self.outputs = outputs

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        tokens = self.tokenizer(numeric, categorical)
        x = torch.cat([self.cls.expand(tokens.shape[0], 1, -1), tokens], dim=1)
        for block in self.blocks:
            x = block(x)
        out = self.head(x[:, 0])
        return out.squeeze(1) if self.outputs == 1 else out

    def shard_units(self) -> list[nn.Module]:
        """Its blocks: nearly all of its parameters, one block's gathered at a time."""
        return list(self.blocks)


class FeatureTokenizer(nn.Module):
    """One token of `dim` numbers per feature: for a number, value x weight + missing flag x
    weight + bias (the flag is part of the number, not a feature of its own: folding it in
    halves the tokens, and attention costs the square of their count); for a category, its
    embedding + bias. A group without columns has no parameters: the exporter cannot trace an
    initializer of width 0."""

    def __init__(self, numeric_width: int, cardinalities: list[int], dim: int):
        super().__init__()
        if numeric_width % 2:
            raise ValueError(
                f"numeric_width={numeric_width}: the FT-Transformer reads it as numbers then one"
                " missing flag each (`ml.data.Preprocessor.inputs`), so it must be even"
            )
        if not numeric_width and not cardinalities:
            raise ValueError("the FT-Transformer needs at least one feature to make a token of")
        self.numbers = NumberTokens(numeric_width // 2, dim) if numeric_width else None
        embeddings = [nn.Embedding(n, dim) for n in cardinalities]
        for embedding in embeddings:
            _uniform(embedding.weight.data, dim)
        self.categories = nn.ModuleList(embeddings)
        self.category_bias = _token_parameter(len(cardinalities), dim) if cardinalities else None

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        tokens = []
        if self.numbers is not None:
            tokens.append(self.numbers(numeric))
        if self.category_bias is not None:
            embedded = [e(categorical[:, i]) for i, e in enumerate(self.categories)]
            tokens.append(torch.stack(embedded, dim=1) + self.category_bias)
        return torch.cat(tokens, dim=1)


class NumberTokens(nn.Module):
    """The tokens of `count` numbers from (batch, 2 x count) inputs, the numbers then their
    missing flags: value x weight + flag x missing weight + bias."""

    def __init__(self, count: int, dim: int):
        super().__init__()
        self.count = count
        self.weight = _token_parameter(count, dim)
        self.missing_weight = _token_parameter(count, dim)
        self.bias = _token_parameter(count, dim)

    def forward(self, numeric: torch.Tensor) -> torch.Tensor:
        values = numeric[:, : self.count].unsqueeze(-1)
        missing = numeric[:, self.count :].unsqueeze(-1)
        return values * self.weight + missing * self.missing_weight + self.bias


class TransformerBlock(nn.Module):
    """Pre-norm: x + attention(norm(x)), then that + feed-forward(norm(that))."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_hidden: int,
        *,
        attention_dropout: float,
        ffn_dropout: float,
        normalize_input: bool,
    ):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim) if normalize_input else nn.Identity()
        self.attention = SelfAttention(dim, num_heads, attention_dropout)
        self.ffn_norm = nn.LayerNorm(dim)
        self.ffn = ReGLUFeedForward(dim, ffn_hidden, ffn_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention in plain matmuls and a softmax: deterministic on every device,
    and exported by the TorchScript-based ONNX exporter as the same few ops (no fused kernel
    whose export or determinism depends on the torch version)."""

    def __init__(self, dim: int, num_heads: int, dropout: float):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (batch, tokens, 3 * dim) → 3 x (batch, heads, tokens, head_dim)
        qkv = self.qkv(x).unflatten(-1, (3, self.num_heads, self.head_dim)).permute(2, 0, 3, 1, 4)
        query, key, value = qkv.unbind(0)
        scores = query @ key.transpose(-2, -1) * self.head_dim**-0.5
        weights = self.dropout(torch.softmax(scores, dim=-1))
        return self.out((weights @ value).transpose(1, 2).flatten(2))


class ReGLUFeedForward(nn.Module):
    """Linear to twice `hidden`, ReGLU (a x relu(b)), dropout, linear back: the paper's FFN."""

    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.up = nn.Linear(dim, 2 * hidden)
        self.dropout = nn.Dropout(dropout)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.up(x).chunk(2, dim=-1)
        return self.down(self.dropout(a * torch.relu(b)))


def _token_parameter(rows: int, dim: int) -> nn.Parameter:
    """A (rows, dim) parameter initialized as the paper's tokens are (`_uniform`)."""
    return nn.Parameter(_uniform(torch.empty(rows, dim), dim))


def _uniform(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """The paper's initialization of tokens: uniform in ±1/sqrt(dim)."""
    bound = dim**-0.5
    return nn.init.uniform_(tensor, -bound, bound)


def team_model(
    config: ModelConfig, numeric_width: int, cardinalities: list[int], outputs: int
) -> nn.Module:
    """A team's network (`config.architecture`, `package.module:ClassName`), constructed by the
    contract (module docstring); a ValueError naming the import path and the rule it breaks."""
    path = config.architecture
    cls = team_class(path)
    arguments: dict[str, Any] = {
        "numeric_width": numeric_width,
        "cardinalities": list(cardinalities),
        "outputs": outputs,
    }
    options = network_options(config)
    if options is not None:
        arguments["options"] = options
    try:
        inspect.signature(cls).bind(**arguments)
    except TypeError as error:
        raise ValueError(
            f"model.architecture={path!r}: its constructor must accept the keyword arguments"
            f" {sorted(arguments)} ({error})"
        ) from None
    try:
        return cls(**arguments)
    except Exception as error:  # the team's code: whatever it raises, the config cannot train
        raise ValueError(
            f"model.architecture={path!r}: constructing it with {sorted(arguments)} raised"
            f" {type(error).__name__}: {error}"
        ) from error


def team_class(path: str) -> type[nn.Module]:
    """The class an import path `package.module:ClassName` names, checked to be an
    `nn.Module` subclass."""
    named = team_network(path)
    if named is None:
        raise ValueError(f"model.architecture={path!r} is built in, not an import path")
    module_name, class_name = named
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ValueError(
            f"model.architecture={path!r}: the module {module_name!r} must be importable ({error})"
        ) from None
    except Exception as error:
        raise ValueError(
            f"model.architecture={path!r}: importing the module {module_name!r} raised"
            f" {type(error).__name__}: {error}"
        ) from error
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(
            f"model.architecture={path!r}: the module {module_name!r} must define {class_name!r}"
        )
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(
            f"model.architecture={path!r}: {class_name!r} must be a subclass of"
            f" torch.nn.Module, not {cls!r}"
        )
    return cls


def check_network(
    config: ModelConfig, numeric_width: int, cardinalities: list[int], outputs: int
) -> None:
    """Build the network `config` names and run it on a dummy batch of `CHECK_ROWS` rows (zeros:
    every number at its mean, every category unknown): a ValueError naming the architecture
    when it cannot be built or its output has the wrong shape (the contract's (batch,) for one
    output per row, else (batch, outputs))."""
    model = build_model(numeric_width, cardinalities, outputs, config).eval()
    numeric = torch.zeros(CHECK_ROWS, numeric_width)
    categorical = torch.zeros(CHECK_ROWS, len(cardinalities), dtype=torch.int64)
    path = config.architecture
    try:
        with torch.inference_mode():
            out = model(numeric, categorical)
    except Exception as error:
        raise ValueError(
            f"model.architecture={path!r}: forward(numeric, categorical) on a {CHECK_ROWS}-row"
            f" batch (numeric {tuple(numeric.shape)}, categorical {tuple(categorical.shape)})"
            f" raised {type(error).__name__}: {error}"
        ) from error
    expected = (CHECK_ROWS,) if outputs == 1 else (CHECK_ROWS, outputs)
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if shape != expected:
        raise ValueError(
            f"model.architecture={path!r}: forward must return a tensor of shape (batch,) for one"
            f" output per row, (batch, outputs) for several: for a {CHECK_ROWS}-row batch and"
            f" {outputs} output(s), {expected}, not {shape}"
        )
