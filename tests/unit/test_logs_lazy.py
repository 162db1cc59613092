"""Logging is configured without importing structlog, and applies once a module that logs loads."""

from __future__ import annotations

import json
import subprocess
import sys


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)


def test_a_query_path_configures_logging_without_loading_structlog() -> None:
    """The CLI's set-up plus a query's modules (command, backends) leave structlog unimported."""
    out = run(
        "import sys, logging\n"
        "from orchestrator import logs\n"
        "import orchestrator.cli.deploy_cmds, orchestrator.client.backends\n"
        "logs.configure(json=False, level=logging.CRITICAL)\n"
        "print('structlog' in sys.modules)"
    ).stdout
    assert out.strip() == "False"


def test_configuration_chosen_first_applies_to_a_module_loaded_later() -> None:
    """configure() before the engine is imported: the engine's log lines follow it (JSON on stderr)."""
    result = run(
        "import logging\n"
        "from orchestrator import logs\n"
        "logs.configure(json=True, level=logging.INFO)\n"
        "from orchestrator.deploy import deployer\n"
        "deployer.log.debug('hidden')\n"
        "deployer.log.info('shown', host='h1')"
    )
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(r["event"], r["host"], r["level"]) for r in lines] == [("shown", "h1", "info")]
    assert result.stdout == ""


def test_configuration_chosen_after_structlog_loaded_applies_at_once() -> None:
    """configure() with the logging modules already loaded reconfigures at once (the agent's case)."""
    result = run(
        "import logging\n"
        "from orchestrator.deploy import deployer\n"
        "from orchestrator import logs\n"
        "logs.configure(json=True, level=logging.WARNING)\n"
        "deployer.log.info('hidden')\n"
        "deployer.log.warning('shown')"
    )
    assert [json.loads(line)["event"] for line in result.stderr.splitlines()] == ["shown"]
