"""How ``solaris.yaml`` names a model: ``reference`` or an entry point of the deployment's own.

Pydantic only: the pipeline's settings hold these while Airflow parses the DAG files. What the
named models must do is :mod:`solaris_feast.models.interface`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ModelSpec(BaseModel):
    """A model of your own, built by a factory you name."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    entry_point: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    """package.module:factory, importable where the tasks run; called with options as keyword
    arguments, it returns the model (a FoundationEncoder for fm, a Verifier for verifier)."""
    options: dict[str, Any] = {}
    """Keyword arguments of the factory (JSON values: they are recorded on the model card)."""


class ArtifactSpec(BaseModel):
    """A model of your own exported with TorchScript (``torch.jit.save``, ``.pt``) or
    ``torch.export`` (``torch.export.save``, ``.pt2``), called with the tensors of
    :mod:`solaris_feast.models.interface`'s artifact contract."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    artifact: str = Field(min_length=1)
    """Path of the exported file (.pt: TorchScript, .pt2: torch.export); copied into the model
    registry and hashed there when solaris train registers it."""
    history_len: int = Field(32, gt=0)
    """Events of each pair's history the model is given (the newest first)."""


ModelChoice = Literal["reference"] | ModelSpec | ArtifactSpec
"""``reference`` (the project's models, trained by the plugin), a :class:`ModelSpec` or an
:class:`ArtifactSpec`."""
OwnModel = ModelSpec | ArtifactSpec
"""A model of the deployment's own."""
