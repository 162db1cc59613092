"""Run in a test host by bench/warm_switch.py: `switch MODEL` through the agent's socket, as the CLI asks it
(orchestrator.client.backends.AgentClient, the SWITCH operation), with every progress event the agent streams
stamped on arrival (wall clock: the host shares the bench machine's clock). Prints one JSON object:
{"result": the switch's answer, "events": [[wall, event, fields], ...]}.

    python bench/warm/agent_switch.py SOCKET MODEL
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from orchestrator.client.backends import AgentClient
from orchestrator.contract.ops import SWITCH


def main() -> None:
    sock, model = sys.argv[1], sys.argv[2]
    events: list[list[Any]] = []
    result = AgentClient(sock).call(
        SWITCH,
        {"model": model, "no_rollback": False, "force": False},
        lambda event, fields: events.append([time.time(), event, fields]),
    )
    print(json.dumps({"result": result, "events": events}, default=str))


if __name__ == "__main__":
    main()
