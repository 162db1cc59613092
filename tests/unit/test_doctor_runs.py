"""doctor runs the engine's probe (an import of the engine as the units' user: ~20 s for vLLM on a GPU box)
once per distinct interpreter and environment, not once per model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.core.observed import CommandResult
from orchestrator.testing.host import FakeShell

from .conftest import OpsWorld


class EngineShell(FakeShell):
    """The engine script's shebang names its Python; the probe answers like an engine that has every flag."""

    def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, idempotent: bool = False
    ) -> CommandResult:
        if tuple(argv[:1]) == ("head",):
            self.w.commands.append(tuple(argv))
            return CommandResult("head", 0, "#!/opt/vllm/bin/python3\n")
        if tuple(argv[:1]) == ("systemd-run",):
            self.w.commands.append(tuple(argv))
            return CommandResult("systemd-run", 0, "version 0.25.1\nflag --enable-sleep-mode\n")
        return super().run(argv, timeout=timeout, check=check, idempotent=idempotent)


def probe_runs(w: OpsWorld) -> list[tuple[str, ...]]:
    return [argv for argv in w.host.commands if argv[:1] == ("systemd-run",)]


def test_models_with_one_environment_share_one_probe(tmp_path: Path) -> None:
    """alpha and beta (GPUs 0-3) share a probe, gamma (GPUs 4-7) has its own; each model still gets its verdict."""
    w = OpsWorld(tmp_path / "state")
    w.ops.ports_for("box").shell = EngineShell(w.host)
    report = w.ops.doctor("box", [])
    assert len(probe_runs(w)) == 2
    checks = {c["check"]: c["status"] for c in report["checks"]}
    assert all(checks[f"engine {m}"] == "ok" for m in ("alpha", "beta", "gamma"))
