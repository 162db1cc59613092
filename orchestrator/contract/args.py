"""The operations' arguments: strict JSON types, no unknown keys, names checked against the catalog.

Parsed once, where a request comes in (the agent's socket, or the in-process backend): a bad one is a
UsageError naming the operation, the argument and the value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

if TYPE_CHECKING:
    from orchestrator.core.catalog import Catalog


class Args(BaseModel):
    """Arguments of one operation: strict JSON types, no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    _on: str | None = PrivateAttr(None)  # the host a job holds, resolved once where it is parsed

    @property
    def on(self) -> str | None:
        """The host this request's job holds (contract.operation.Operation.parse resolved it); None: every
        host (recover without --on)."""
        return self._on

    def check(self, catalog: Catalog) -> None:
        """Names must exist in the catalog (never used as paths before this)."""
        model = getattr(self, "model", None)
        if model is not None:
            catalog.model(model)
        host = getattr(self, "host", None)
        if host is not None:
            catalog.host(host)


class NoArgs(Args):
    pass


class ModelArgs(Args):
    model: str = Field(max_length=200)


class ModelsArgs(Args):
    models: list[Annotated[str, Field(max_length=200)]] = Field(min_length=1, max_length=64)

    def check(self, catalog: Catalog) -> None:
        for model in self.models:
            catalog.model(model)


class StageArgs(ModelArgs):
    # A fleet rollout's peer box that already holds the weights (adapters/weights_peer.py checks each field
    # as deploy.toml's host entries are checked).
    peer: dict[str, str | int | None] | None = None


# What a fleet controller's switch or rollback is part of ("rollout #3 by alice@laptop"): the box records
# it beside the caller it authenticated (the controller's login), never instead of it. No control
# characters: it lands in history lines and logs.
ROLLOUT_LABEL = r"^rollout #[0-9]{1,12}( by [^\x00-\x1f\x7f]{1,150})?$"


class SwitchArgs(ModelArgs):
    no_rollback: bool = False
    force: bool = False
    rollout: str | None = Field(None, max_length=200, pattern=ROLLOUT_LABEL)


class HostArgs(Args):
    host: str | None = Field(None, max_length=200)


class DoctorArgs(HostArgs):
    models: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=64)

    def check(self, catalog: Catalog) -> None:
        super().check(catalog)
        for model in self.models:
            catalog.model(model)


# A unit name as systemctl takes it (never an option: it follows "--" there too).
UNIT_NAME = r"^[A-Za-z0-9][A-Za-z0-9:_.@\\-]{0,250}$"


class AdoptArgs(HostArgs):
    """`adopt`: the units to adopt (none: every engine the box runs outside the product)."""

    units: list[Annotated[str, Field(max_length=256, pattern=UNIT_NAME)]] = Field(default_factory=list, max_length=64)
    pids: list[Annotated[int, Field(ge=1, le=2**31 - 1)]] = Field(default_factory=list, max_length=64)


class RollbackArgs(HostArgs):
    to_revision: int | None = Field(None, ge=1, le=2**31 - 1)
    rollout: str | None = Field(None, max_length=200, pattern=ROLLOUT_LABEL)


class HistoryArgs(HostArgs):
    limit: int = Field(50, ge=1, le=10_000)


class IdleArgs(ModelArgs):
    """demand_sleep, demand_stop: the on-demand broker's idle model, and why it goes (for its event)."""

    reason: str = Field(max_length=2000)


class ProxyArgs(Args):
    """reroute, proxy_up, proxy_off, leftover_proxy_off: the host whose front proxy the agent acts on,
    and why (a config push, the agent's start: for its event)."""

    host: str = Field(max_length=200)
    reason: str = Field(max_length=2000)


class ConfigPushArgs(Args):
    text: str = Field(max_length=900_000)
    name: str | None = Field(None, max_length=200)


class RolloutStartArgs(ModelArgs):
    """A fleet rollout the controller's agent runs (rollout/fleet.py); None: the group's own setting."""

    group: str | None = Field(None, max_length=200)
    canary: int | None = Field(None, ge=0, le=10_000)
    batch: int | None = Field(None, ge=1, le=10_000)
    max_failures: int | None = Field(None, ge=0, le=10_000)
    rollback_all: bool = False


class RolloutIdArgs(Args):
    """Which rollout (None: the unfinished one, or for status the latest)."""

    id: int | None = Field(None, ge=1, le=2**62)


class RolloutAbortArgs(RolloutIdArgs):
    rollback_all: bool = False


class TuneArgs(ModelArgs):
    """A tune run an agent runs as a job of the model's host (agent/tune_jobs.py): the CLI's options,
    as text where the CLI parses them (layouts, seqs: core/tune.py checks them again here)."""

    layouts: str | None = Field(None, max_length=1000)
    top: int = Field(3, ge=1, le=16)
    seqs: str | None = Field(None, max_length=1000)
    objective: str | None = Field(None, max_length=200)
    concurrency: list[Annotated[int, Field(ge=1, le=1_000_000)]] = Field(min_length=1, max_length=64)
    max_tokens: int = Field(512, ge=1, le=10_000_000)
    prompt_tokens: int = Field(128, ge=1, le=10_000_000)
    duration_s: float | None = Field(None, gt=0, le=10_000_000)
    requests: int | None = Field(None, ge=1, le=10_000_000)
    repeats: int = Field(1, ge=1, le=20)
    restore: bool = False
    config_json: dict[str, object] | None = None  # --model-config, read by the CLI


class TuneHostArgs(Args):
    """Which unfinished or running tune run: the host's (None: the only host), or MODEL's host."""

    host: str | None = Field(None, max_length=200)
    model: str | None = Field(None, max_length=200)
