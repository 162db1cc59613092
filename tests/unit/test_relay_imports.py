"""The relay starts once per remote request: what it imports is paid on the box each time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = """
import socket, sys, threading
from orchestrator.agent import relay
server = socket.socket(socket.AF_UNIX)
server.bind(sys.argv[1])
server.listen(1)
threading.Thread(target=lambda: server.accept()[0].close(), daemon=True).start()
code = relay.main(["--socket", sys.argv[1]])
print(code, sorted(m for m in sys.modules if m.startswith("orchestrator")))
"""


def test_relay_told_its_socket_imports_no_settings(tmp_path: Path) -> None:
    """A relay given --socket pipes to it without importing the settings or wire modules."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "agent.sock")],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    ).stdout
    assert out.strip() == "0 ['orchestrator', 'orchestrator.agent', 'orchestrator.agent.relay']"
