"""What the agent loads from deploy.toml is built and checked once, the same way at start and for
`config push` (before anything is written): a schedule that cannot fire again (the review's
`0 0 1 1 * 0 2001`, refused as a cron of 7 fields: only 5 are accepted) is a ConfigError naming the
schedule and its cron (exit 2), never a traceback, and a refused push changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator import settings
from orchestrator.agent.daemon import Agent
from orchestrator.core.catalog import Catalog
from orchestrator.deploy.operations import Operations
from orchestrator.errors import ConfigError
from orchestrator.ports import HostPorts
from orchestrator.testing import FakeClock, FakeStateStore

PAST = "0 0 1 1 * 0 2001"  # minute hour day month weekday second year: fired once, in 2001
NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC).timestamp()


def deploy_toml(state: Path, cron: str) -> str:
    return (
        f'state_dir = "{state}"\n'
        '[hosts.box]\ntransport = "ssh"\naddress = "127.0.0.9"\ngpus = 8\ngpu_memory_gib = 96\n'
        '[models.alpha]\nrepo = "org/alpha"\ngpus = [0, 1, 2, 3]\ntensor_parallel = 4\nport = 8000\n'
        f'[schedules.nightly]\ncron = "{cron}"\naction = "redeploy"\nhost = "box"\n'
    )


def no_ports(name: str) -> HostPorts:
    raise AssertionError(f"loading a config reaches no host ({name})")


def ops_for(catalog: Catalog) -> Operations:
    return Operations(catalog, no_ports, store=FakeStateStore())


def agent_on(path: Path, clock: FakeClock) -> Agent:
    catalog = settings.load(path)
    return Agent(
        catalog,
        ops_for(catalog),
        socket=str(path.parent / "agent.sock"),
        metrics_port=None,
        clock=clock,
        config_path=str(path),
        ops_factory=ops_for,
    )


def push(agent: Agent, text: str) -> list[dict[str, Any]]:
    return list(agent.dispatch("config_push", {"text": text, "name": "new.toml"}, "alice@test"))


def test_a_cron_that_only_fired_in_the_past_is_refused_when_the_file_is_loaded(tmp_path: Path) -> None:
    """settings.load refuses it with exit 2, naming schedules.nightly.cron and the expression."""
    path = tmp_path / "deploy.toml"
    path.write_text(deploy_toml(tmp_path / "state", PAST))
    with pytest.raises(ConfigError, match=r"schedules\.nightly\.cron: .*'0 0 1 1 \* 0 2001'") as exc:
        settings.load(path)
    assert exc.value.exit_code == 2 and str(path) in str(exc.value)


def test_a_catalog_built_in_code_refuses_a_schedule_that_cannot_fire_again(tmp_path: Path) -> None:
    """Catalog validation (what the agent is built from) names schedules.old.cron and the expression."""
    with pytest.raises(ValidationError, match=r"old[\s\S]*cron[\s\S]*0 0 1 1 \* 0 2001"):
        Catalog.model_validate(
            {
                "state_dir": str(tmp_path / "state"),
                "hosts": {"box": {"transport": "ssh", "address": "127.0.0.9", "gpus": 8, "gpu_memory_gib": 96}},
                "schedules": {"old": {"cron": PAST, "action": "redeploy", "host": "box"}},
            }
        )


def test_config_push_of_a_schedule_without_a_future_run_changes_nothing(tmp_path: Path) -> None:
    """The push is refused with exit 2 naming the schedule; the file, .prev and revisions stay as they were."""
    path = tmp_path / "deploy.toml"
    good = deploy_toml(tmp_path / "state", "0 3 * * *")
    path.write_text(good)
    agent = agent_on(path, FakeClock(start=NOW))
    before = agent.configs.show() if agent.configs else None
    with pytest.raises(ConfigError, match=r"schedules\.nightly\.cron: .*2001") as exc:
        push(agent, deploy_toml(tmp_path / "state", PAST))
    assert exc.value.exit_code == 2 and "new.toml" in str(exc.value)
    assert path.read_text() == good and not path.with_name("deploy.toml.prev").exists()
    assert agent.configs is not None and agent.configs.show() == before
    assert agent.scheduler.next_runs == {"nightly": datetime(2026, 12, 2, 3, 0, tzinfo=UTC).timestamp()}
