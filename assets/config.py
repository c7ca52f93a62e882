"""Launchpad config classes derived from the dataclasses that define a setting once (a use case's
policies in `declare/`, training's `ml.config.TrainConfig`): the same field names, types,
docstrings and defaults, typed in the Dagster UI, never copied by hand."""

import dataclasses
import typing
from collections.abc import Collection, Mapping
from typing import Any

import dagster as dg
from pydantic import Field, create_model

from ml.config import fields_of


def config_class(
    cls: type,
    name: str,
    defaults: Any = None,
    *,
    skip: Collection[str] = (),
    extra: Mapping[str, tuple[Any, Any]] | None = None,
) -> type[dg.Config]:
    """A Dagster config class mirroring the dataclass `cls`: a field per field (a section per
    nested dataclass, a list per tuple), each with its docstring as description and its value in
    `defaults` (an instance of `cls`; else the dataclass's own default) as default. Fields in
    `skip` are left out (set by the asset itself); `extra` adds fields of the step's own
    (name: (type, pydantic Field))."""
    fields: dict[str, Any] = {}
    for spec in fields_of(cls):
        if spec.name in skip:
            continue
        default = spec.default if defaults is None else getattr(defaults, spec.name)
        if dataclasses.is_dataclass(spec.kind):
            section = config_class(spec.kind, f"{name}_{spec.name}", default, skip=skip)  # type: ignore[arg-type]
            fields[spec.name] = (section, Field(default_factory=section, description=spec.doc))
        elif typing.get_origin(spec.kind) is tuple:
            (item,) = {a for a in typing.get_args(spec.kind) if a is not Ellipsis}
            listed = ... if default is dataclasses.MISSING else list(default)
            fields[spec.name] = (list[item], Field(default=listed, description=spec.doc))
        else:
            value = ... if default is dataclasses.MISSING else default
            fields[spec.name] = (spec.kind, Field(default=value, description=spec.doc))
    fields.update(extra or {})
    return create_model(name, __base__=dg.Config, **fields)
