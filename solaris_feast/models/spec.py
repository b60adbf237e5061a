"""How ``solaris.yaml`` names a model: ``reference`` or an entry point of the deployment's own.

Pydantic only: the pipeline's settings hold these while Airflow parses the DAG files. What the
named models must do is :mod:`solaris_feast.models.interface`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ModelSpec(BaseModel):
    """A model of your own, built by a factory you name."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    entry_point: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    """package.module:factory, importable where the tasks run; called with options as keyword
    arguments, it returns the model (a FoundationEncoder for fm, a Verifier for verifier)."""
    options: dict[str, Any] = {}
    """Keyword arguments of the factory (JSON values: they are recorded on the model card)."""

    @field_validator("options")
    @classmethod
    def _json_values(cls, options: dict[str, Any]) -> dict[str, Any]:
        # The card records the options as JSON and every round calls the factory with the
        # card's: a value JSON cannot hold as it is (YAML's unquoted 2026-01-01 is a date) was
        # a date in training and the string "2026-01-01" in every round after.
        import json

        for key, value in options.items():
            try:
                same = json.loads(json.dumps(value)) == value
            except (TypeError, ValueError):
                same = False
            if not same:
                raise ValueError(
                    f"option {key!r} is a {type(value).__name__} ({value!r}), which the model "
                    "card cannot record as it is: give a JSON value (quote a date or a time)"
                )
        return options


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
