"""The training configuration: one typed tree shared by the Dagster asset's config and the
`python -m ml.train` command line, validated in one place.

On the command line every field is a dotted flag: `--optim.lr 0.003 --model.hidden_sizes 256,64`.
"""

import argparse
import dataclasses
import hashlib
import itertools
import json
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ml.task import TASKS

STRATEGIES = ("ddp", "fsdp")
"""`TrainConfig.strategy`'s choices."""
ARCHITECTURES = ("mlp", "ft_transformer")
"""`ModelConfig.architecture`'s built-in choices (`ml.model`); anything else is an import path."""
IMPORT_PATH = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<name>[A-Za-z_]\w*)$")
"""A team's own network, `package.module:ClassName`."""


@dataclass(frozen=True)
class DataConfig:
    training_set: str = ""
    """Parquet file of the training set (the `training_set` asset): features, label, split."""
    label: str = "label"
    """The label column: 0/1 for a binary task, a number for regression (a use case's training
    asset sets the one it declares)."""
    task: str = "binary"
    """What the model learns from the label: binary (P(label = 1)) or regression (its value)."""
    split_column: str = "split"
    """Column naming each row's part: train, validation or test."""
    feature_service: str = ""
    """The Feast FeatureService the training set was joined through (recorded in the manifest;
    a use case's training asset sets it)."""


@dataclass(frozen=True)
class ModelConfig:
    architecture: str = "mlp"
    """The network (`ml.model`): `mlp`, `ft_transformer`, or a team's own `torch.nn.Module` as
    `package.module:ClassName` (the contract is in docs/training.md, "Models")."""
    hidden_sizes: tuple[int, ...] = (128, 64)
    """Widths of the MLP's hidden layers."""
    max_embedding_dim: int = 16
    """The MLP's embedding width of a categorical feature: min(this, ceil(sqrt(vocabulary size))
    + 1)."""
    dropout: float = 0.1
    """Dropout as a fraction: after every hidden layer of the MLP; in the feed-forward part of
    every block of the FT-Transformer."""
    token_dim: int = 192
    """The FT-Transformer's width: every feature's token, and the [CLS] token, has this many
    numbers (a multiple of num_heads)."""
    num_blocks: int = 3
    """The FT-Transformer's depth: its transformer blocks, each one unit of sharding (FSDP)."""
    num_heads: int = 8
    """Attention heads of every FT-Transformer block."""
    ffn_factor: float = 4 / 3
    """Hidden width of a block's feed-forward part (ReGLU), as a multiple of token_dim."""
    attention_dropout: float = 0.2
    """Dropout of the FT-Transformer's attention weights, as a fraction."""
    options: str = ""
    """A team's own network only: a JSON object passed to its constructor as `options` (e.g.
    `{"width": 256}`); empty: no `options` argument."""
    offset: str = ""
    """A regression only: a numeric feature that is itself a forecast of the label, in its units
    (a seasonal-naive column); the network's output is added to it, so the network learns the
    label's difference from that forecast (`ml.model.Offset`; in the served graph too). Where
    the column is missing, its train-split mean stands in. Empty: no offset."""

    @property
    def ffn_hidden(self) -> int:
        """The hidden width of an FT-Transformer block's feed-forward part."""
        return int(self.token_dim * self.ffn_factor)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 3e-3
    """Peak learning rate of AdamW."""
    weight_decay: float = 1e-4
    batch_size: int = 512
    """Rows per step on each rank; the global batch is this times the world size."""
    max_epochs: int = 20
    patience_epochs: int = 3
    """Stop after this many epochs without a lower validation loss."""
    warmup_fraction: float = 0.05
    """Share of the planned steps spent warming the learning rate up linearly, as a fraction."""


@dataclass(frozen=True)
class CatalogRef:
    """The catalog entry a run started from (`declare.catalog`), recorded in its manifest; not
    read by training."""

    name: str = ""
    """The use case's catalog entry the run starts from (`<use case>/configs/<name>.toml`);
    empty outside a use case. The launchpad's other fields default to the use case's default
    entry: those left so come from the entry named here (`ml.catalog.resolve`)."""
    sha256: str = ""
    """sha256 of the settings the entry resolves to (`ml.catalog.settings_sha256`)."""
    overridden: tuple[str, ...] = ()
    """The settings the run changed from the entry's, by dotted name."""


@dataclass(frozen=True)
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    catalog: CatalogRef = field(default_factory=CatalogRef)
    seed: int = 2013
    """Seeds parameter init, shuffling and dropout on every rank."""
    output_dir: str = ""
    """Where checkpoints, weights and the run manifest go."""
    checkpoint_every_steps: int = 200
    process_group_timeout_s: int = 60
    """How long a collective waits for a missing rank before failing (torch's default is 30 min)."""
    precision: str = "auto"
    """Compute precision: bf16 (autocast on CUDA), fp32, or auto (bf16 where the GPU has it)."""
    strategy: str = "ddp"
    """How ranks share the model: ddp (a replica on each) or fsdp (parameters, gradients and
    optimizer state sharded over the ranks, FSDP2)."""
    preemption_grace_s: int = 30
    """Seconds between SIGTERM and SIGKILL that a preempted job has to write its checkpoint (the
    pod's terminationGracePeriodSeconds is set to match)."""

    def __post_init__(self) -> None:
        if self.data.task not in TASKS:
            raise ValueError(
                f"invalid training config: data.task={self.data.task!r}:"
                f" must be one of {tuple(TASKS)}"
            )
        checks = {
            "model.hidden_sizes": all(w > 0 for w in self.model.hidden_sizes),
            "model.max_embedding_dim": self.model.max_embedding_dim > 0,
            "model.dropout": 0.0 <= self.model.dropout < 1.0,
            "optim.lr": self.optim.lr > 0,
            "optim.weight_decay": self.optim.weight_decay >= 0,
            "optim.batch_size": self.optim.batch_size > 0,
            "optim.max_epochs": self.optim.max_epochs > 0,
            "optim.patience_epochs": self.optim.patience_epochs > 0,
            "optim.warmup_fraction": 0.0 <= self.optim.warmup_fraction < 1.0,
            "checkpoint_every_steps": self.checkpoint_every_steps > 0,
            "process_group_timeout_s": self.process_group_timeout_s > 0,
            "precision": self.precision in ("auto", "bf16", "fp32"),
            "strategy": self.strategy in STRATEGIES,
            "preemption_grace_s": self.preemption_grace_s > 0,
            "model.token_dim": self.model.token_dim > 0,
            "model.num_blocks": self.model.num_blocks > 0,
            "model.num_heads": self.model.num_heads > 0,
            "model.ffn_factor": self.model.ffn_factor > 0 and self.model.ffn_hidden > 0,
            "model.attention_dropout": 0.0 <= self.model.attention_dropout < 1.0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"invalid training config: {name}={_get(self, name)!r}")
        _check_model(self.model)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def attempt_key(self, data_sha256: str, code: str) -> str:
        """Names the training this config runs on the data with sha256 `data_sha256` with the
        code `code`, wherever its files go: two attempts with one key train the same weights
        (at one world size), so a later one may resume from an earlier one's checkpoints."""
        identity = self.to_dict()
        identity.pop("output_dir")
        identity["data"] = {**identity["data"], "training_set": data_sha256}
        text = json.dumps({"config": identity, "code": code}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        """The config of a nested dict (e.g. Dagster run config); unknown keys are refused."""
        return _build(cls, values, "")


def parser(description: str) -> argparse.ArgumentParser:
    """A command line with one `--section.field` flag per config field, defaults shown."""
    out = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    for name, _, default, doc in _leaves(TrainConfig, TrainConfig(), ""):
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        out.add_argument(f"--{name}", type=str, default=shown, help=doc or " ", dest=name)
    return out


def from_args(args: argparse.Namespace) -> TrainConfig:
    values = {
        name: _parse(getattr(args, name), kind, name)
        for name, kind, _, _ in _leaves(TrainConfig, TrainConfig(), "")
    }
    return TrainConfig.from_dict(nested(values))


def to_args(config: TrainConfig) -> list[str]:
    """The command line that `from_args` turns back into `config`."""
    out = []
    for name, _, value, _ in _leaves(TrainConfig, config, ""):
        out += [f"--{name}", ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    return out


def dotted(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 0.1}} → {"optim.lr": 0.1}: the dotted names of `python -m ml.train`."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def nested(values: Mapping[str, Any]) -> dict[str, Any]:
    """`dotted`'s inverse: {"optim.lr": 0.1} → {"optim": {"lr": 0.1}}."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        node = out
        *sections, leaf = name.split(".")
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return out


@dataclass(frozen=True)
class FieldSpec:
    """One field of a config class, for building other schemas from it (e.g. Dagster's)."""

    name: str
    kind: Any
    """The annotated type; a config dataclass for a section."""
    default: Any
    doc: str


def fields_of(cls: type) -> list[FieldSpec]:
    """The fields of a config dataclass, in declaration order, with defaults and docstrings; a
    field without a default has `dataclasses.MISSING`."""
    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    return [
        FieldSpec(f.name, hints[f.name], _default(f), docs.get(f.name, ""))
        for f in dataclasses.fields(cls)
    ]


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _leaves(cls: type, instance: Any, prefix: str):
    """(dotted name, type, value, docstring) of every leaf field, in declaration order."""
    for spec in fields_of(cls):
        kind, value = spec.kind, getattr(instance, spec.name)
        if dataclasses.is_dataclass(kind):
            yield from _leaves(kind, value, f"{prefix}{spec.name}.")  # type: ignore[arg-type]
        else:
            yield f"{prefix}{spec.name}", kind, value, spec.doc


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field (the convention used above), from the class source."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _parse(text: str, kind: Any, name: str) -> Any:
    try:
        if typing.get_origin(kind) is tuple:
            (item,) = {a for a in typing.get_args(kind) if a is not Ellipsis}
            return tuple(item(part) for part in str(text).split(",") if part.strip())
        if kind is bool:
            return str(text).lower() in ("1", "true", "yes")
        return kind(text)
    except ValueError:
        raise ValueError(f"invalid training config: {name}={text!r} is not a {kind}") from None


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(
            f"invalid training config: unknown field(s) {[prefix + u for u in unknown]}"
        )
    kwargs = {}
    for name, value in values.items():
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            kwargs[name] = _build(kind, value, f"{prefix}{name}.")  # type: ignore[arg-type]
        elif typing.get_origin(kind) is tuple or isinstance(kind, types.GenericAlias):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def team_network(architecture: str) -> tuple[str, str] | None:
    """(module, class name) of an architecture given by import path; None for a built-in one."""
    if architecture in ARCHITECTURES:
        return None
    match = IMPORT_PATH.match(architecture)
    if match is None:
        raise ValueError(
            f"invalid training config: model.architecture={architecture!r}: must be one of"
            f" {ARCHITECTURES} or an import path `package.module:ClassName`"
        )
    return match["module"], match["name"]


def network_options(model: ModelConfig) -> dict[str, Any] | None:
    """The `options` a team's network is constructed with; None when `model.options` is empty."""
    if not model.options.strip():
        return None
    try:
        options = json.loads(model.options)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"invalid training config: model.options={model.options!r} is not JSON ({error})"
        ) from None
    if not isinstance(options, dict):
        raise ValueError(
            f"invalid training config: model.options={model.options!r} must be a JSON object"
        )
    return options


def _check_model(model: ModelConfig) -> None:
    """The rules of `ModelConfig` that join fields: each a ValueError naming the rule."""
    if model.token_dim % model.num_heads:
        raise ValueError(
            f"invalid training config: model.token_dim={model.token_dim} must be a multiple of"
            f" model.num_heads={model.num_heads} (each head takes an equal share of a token)"
        )
    team = team_network(model.architecture)
    if network_options(model) is not None and team is None:
        raise ValueError(
            f"invalid training config: model.options={model.options!r} is for a network given"
            f" by import path, not for model.architecture={model.architecture!r}"
        )


def _get(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part)
    return config
