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


ModelChoice = Literal["reference"] | ModelSpec
"""``reference`` (the project's models, trained by the plugin) or a :class:`ModelSpec`."""
