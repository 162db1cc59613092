"""HAProxy's master CLI over its unix socket: the proxy's workers, old and current, and what they hold.

Standard library only, and no import of the project: the front-proxy adapter calls these functions in its
own process on the agent's box (a warm switch's drain runs them in its gap: no interpreter to start), and
sends this file's text to a host over SSH as a script (``python -I -S -c <this file> master|stats ...``),
where ``main`` prints the same answers as JSON.
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any


def ask(path: str, cmd: str) -> str | None:
    """One command's answer; None when the master did not answer (it re-executes on a reload, or is gone)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    try:
        s.connect(path)
        s.sendall(cmd.encode() + b"\n")
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    except OSError:
        return None
    finally:
        s.close()
    return out.decode(errors="replace")


def master(path: str, mode: str, commands: list[str]) -> dict[str, Any]:
    """Send ``commands`` (the drain's marks; their answers in "said"), then `show proc`; with mode "old"
    also `show info`, `show stat` and each backend's `get var proc.drained_<backend>` of every old worker
    (`@!PID` reaches a worker through the master). "proc" is None when the master did not answer."""
    said = [ask(path, cmd) or "" for cmd in commands]
    proc = ask(path, "show proc")
    old: dict[str, dict[str, str]] = {}
    if proc is not None and mode == "old":
        section = ""
        for line in proc.splitlines():
            if line.startswith("#"):
                section = line.strip("# ").strip()
            elif section == "old workers" and line.split()[:1] and line.split()[0].isdigit():
                pid = line.split()[0]
                stat = ask(path, "@!" + pid + " show stat") or ""
                backends = [ln.split(",")[0] for ln in stat.splitlines() if ln.split(",")[1:2] == ["BACKEND"]]
                marks = "".join(
                    ask(path, "@!" + pid + " get var proc.drained_" + b) or ""
                    for b in backends
                    if b.replace("_", "").isalnum()
                )
                old[pid] = {"info": ask(path, "@!" + pid + " show info") or "", "stat": stat, "marks": marks}
    return {"proc": proc, "old": old, "said": said}


def stats(path: str) -> list[str] | None:
    """`show stat` of every worker, current and old (models on demand: idleness); None: no master."""
    proc = ask(path, "show proc")
    if proc is None:
        return None
    pids = [ln.split()[0] for ln in proc.splitlines() if ln.split()[1:2] == ["worker"] and ln.split()[0].isdigit()]
    return [ask(path, "@!" + pid + " show stat") or "" for pid in pids]


def main(argv: list[str]) -> None:
    """``master SOCKET MODE [COMMAND...]`` or ``stats SOCKET``: the answer as JSON on stdout."""
    if argv[:1] == ["stats"]:
        json.dump(stats(argv[1]), sys.stdout)
    else:
        json.dump(master(argv[1], argv[2], argv[3:]), sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
