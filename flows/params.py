"""The pipeline's one typed parameter: what the Prefect UI shows as a form."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Keys that name code to run: they come only from a committed config file, never from a run's
# parameters (a deployment's form is input from another person).
CODE_KEYS = ("task", "model.factory", "model.kwargs")


def code_override(items: list[str]) -> str | None:
    """The error line for the first override that names code to run (``CODE_KEYS``), else None."""
    for item in items:
        key = item.partition("=")[0].strip()
        if any(key == k or key.startswith(k + ".") for k in CODE_KEYS):
            return (f"{key}: names code to run, so it comes only from the committed config file, "
                    "not from an override")
    return None


class PipelineParams(BaseModel):
    """Inputs of one pipeline run. Defaults run the bundled digits pipeline."""

    model_config = ConfigDict(extra="forbid")

    config_path: str = Field("configs/digits.yaml", description="YAML config, relative to the repository root")
    overrides: list[str] = Field(default_factory=list, description="KEY.PATH=VALUE overrides, e.g. training.epochs=3")
    image: str | None = Field(None, description="Container image ref this run executes in (default: TRAINFLOW_IMAGE or 'local')")
    image_digest: str | None = Field(None, description="Image digest (default: TRAINFLOW_IMAGE_DIGEST, or taken from a ref@sha256:...)")
    promotion: Literal["auto", "manual"] | None = Field(None, description="Override registry.promotion")
    nproc_per_node: int | None = Field(None, gt=0, description="Workers per node (default: GPUs, else training.cpu_workers)")

    @field_validator("overrides")
    @classmethod
    def _no_code(cls, items: list[str]) -> list[str]:
        problem = code_override(items)
        if problem:
            raise ValueError(problem)
        return items

    def all_overrides(self) -> list[str]:
        extra = [f"registry.promotion={self.promotion}"] if self.promotion else []
        return [*self.overrides, *extra]


class RetrainParams(PipelineParams):
    """Inputs of the ``retrain`` flow: a pipeline run, made only when the champion is stale."""

    force: bool = Field(False, description="Train even when data, config and code equal the champion's")

    def pipeline_params(self) -> PipelineParams:
        return PipelineParams.model_validate(self.model_dump(exclude={"force"}))
