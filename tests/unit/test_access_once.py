"""The access check (deploy/preflight.check_access: a process on the host, over SSH on a remote one) runs once
per switch: before the deployment is recorded (a refusal exits 2, no rollback), and in preflight only for a
deployment no check of this operation covered (one recorded before a crash, then recovered)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator.core.access import PROBE_SCRIPT
from orchestrator.core.observed import CommandResult
from orchestrator.core.states import Phase
from orchestrator.errors import AccessDenied
from orchestrator.testing import FakeHost
from orchestrator.testing.host import FakeShell

from .conftest import OpsWorld


def probes(host: FakeHost) -> int:
    return sum(1 for argv in host.commands if argv[:3] == ("sh", "-c", PROBE_SCRIPT))


class NoUserShell(FakeShell):
    """A host without the units' user: the access probe answers "nouser"."""

    def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, idempotent: bool = False
    ) -> CommandResult:
        if tuple(argv[:3]) == ("sh", "-c", PROBE_SCRIPT):
            self.w.commands.append(tuple(argv))
            return CommandResult(" ".join(argv[:2]), 0, "nouser\n")
        return super().run(argv, timeout=timeout, check=check, idempotent=idempotent)


def test_a_switch_probes_access_once(tmp_path: Path) -> None:
    """Each switch (a first one, one that replaces a model, a forced redeploy) runs the access probe once, not twice."""
    w = OpsWorld(tmp_path / "state")
    for model, force in (("alpha", False), ("beta", False), ("beta", True)):
        before = probes(w.host)
        assert w.ops.switch(model, force=force)["outcome"] == "active"
        assert probes(w.host) - before == 1


def test_a_switch_refused_for_access_records_nothing(tmp_path: Path) -> None:
    """The switch's own check refuses before a deployment is recorded: AccessDenied (exit 2), no rollback."""
    w = OpsWorld(tmp_path / "state")
    w.ops.ports_for("box").shell = NoUserShell(w.host)
    with pytest.raises(AccessDenied, match="which host box does not have"):
        w.ops.switch("alpha")
    assert w.store.history("box", 10) == [] and probes(w.host) == 1


def test_a_deployment_recovered_after_a_crash_is_checked_by_its_preflight(tmp_path: Path) -> None:
    """A deployment recorded by an operation that died before preflight enters only through preflight:
    it probes there."""
    w = OpsWorld(tmp_path / "state")
    dep = w.ops.deployer().plan_switch("alpha")  # recorded, then the process that recorded it died
    assert dep is not None and probes(w.host) == 0
    w.ops.ports_for("box").shell = NoUserShell(w.host)
    [outcome] = w.ops.recover("box")
    assert outcome["outcome"] == Phase.ABORTED.value and "which host box does not have" in outcome["error"]
    assert probes(w.host) == 1 and w.host.active_units() == []
