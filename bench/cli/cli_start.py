"""How fast the CLI starts: `orchestrator --help`, `status`, `history`, `--host box history`, side by side
with `systemctl --version` and `python -c pass` (median of N runs each).

"start" is the time from exec to the command's first request: the connection to the agent's socket
(a stand-in agent here answers ping, status and history with empty results), or the TCP connection
of `--host` to a loopback listener that stands in for the box's sshd (it closes at once, so the
command then fails with exit 4: what comes after the connect is SSH and the box, not the CLI's start).
"total" is the whole run. Prints one line per run (raw) and a summary table.

    .venv/bin/python bench/cli/cli_start.py [--runs 11] > bench/cli/cli_start.txt
    nice -n -20 .venv/bin/python bench/cli/cli_start.py > bench/cli/cli_start-nice.txt   # as on an idle machine
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.builders.catalog import ONE_BOX_TOML

VENV_BIN = Path(sys.executable).parent
REPLIES = {"ping": {}, "status": {"hosts": {}, "schedules": []}, "history": []}


class Listener:
    """Records when each connection arrives; on a Unix socket, answers like an idle agent."""

    def __init__(self, sock: socket.socket, *, agent: bool) -> None:
        self.sock, self.agent = sock, agent
        self.first: float | None = None
        self.lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            self.first = None

    def _serve(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            with self.lock:
                self.first = self.first or time.monotonic()
            if not self.agent:
                conn.close()
                continue
            with conn, conn.makefile("rb") as stream:
                line = stream.readline()
                if line:
                    op = json.loads(line)["op"]
                    conn.sendall((json.dumps({"result": REPLIES.get(op)}) + "\n").encode())


def run(argv: list[str], env: dict[str, str], listener: Listener | None) -> tuple[float, float | None, int, float]:
    """(wall s, start s or None, exit code, CPU s of the child: user + system, which the load of a
    shared machine does not inflate the way it does wall time)."""
    if listener is not None:
        listener.reset()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    total = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    start = None if listener is None or listener.first is None else listener.first - t0
    return total, start, proc.returncode, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=11)
    runs = parser.parse_args().runs
    work = Path(tempfile.mkdtemp(prefix="cli-start-"))
    (work / "deploy.toml").write_text(ONE_BOX_TOML.format(state=work / "state", extra=""))
    agent_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    agent_sock.bind(str(work / "agent.sock"))
    agent_sock.listen(16)
    agent = Listener(agent_sock, agent=True)
    tcp = socket.create_server(("127.0.0.1", 0))
    sshd = Listener(tcp, agent=False)
    port = tcp.getsockname()[1]
    env = {
        **os.environ,
        "ORCHESTRATOR_CONFIG": str(work / "deploy.toml"),
        "ORCHESTRATOR_SOCKET": str(work / "agent.sock"),
        "HOME": str(work),
    }
    env.pop("ORCHESTRATOR_HOST", None)
    cli = str(VENV_BIN / "orchestrator")
    cases: list[tuple[str, list[str], Listener | None]] = [
        ("systemctl --version", ["systemctl", "--version"], None),
        ("python -c pass", [sys.executable, "-c", "pass"], None),
        ("orchestrator --help", [cli, "--help"], None),
        ("orchestrator status", [cli, "status"], agent),
        ("orchestrator history", [cli, "history"], agent),
        ("orchestrator --host box history", [cli, "--host", f"ssh://bench@127.0.0.1:{port}", "history"], sshd),
    ]
    results: dict[str, list[tuple[float, float | None, int, float]]] = {name: [] for name, _, _ in cases}
    # nice -n -20 (root): the runs get the CPU ahead of the other sessions' processes, so wall time
    # reads about as on an idle machine; the niceness is printed with the load.
    print(
        f"# {runs} runs each, interleaved; os.cpu_count()={os.cpu_count()}, load {os.getloadavg()[0]:.2f}, "
        f"niceness {os.nice(0)}"
    )
    for i in range(runs):
        for name, argv, listener in cases:
            total, start, rc, cpu = run(argv, env, listener)
            results[name].append((total, start, rc, cpu))
            shown = "-" if start is None else f"{start:.3f}"
            print(f"run {i + 1} | {name} | total {total:.3f} s | start {shown} s | cpu {cpu:.3f} s | rc {rc}")
    print(f"# load after: {os.getloadavg()[0]:.2f}")
    print("\n| command | median start s | min start s | median total s | median CPU s | exit |")
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        starts = [s for _, s, _, _ in rows if s is not None]
        start = f"{statistics.median(starts):.3f} | {min(starts):.3f}" if starts else "- | -"
        totals, cpus = [t for t, _, _, _ in rows], [c for _, _, _, c in rows]
        print(
            f"| {name} | {start} | {statistics.median(totals):.3f} | {statistics.median(cpus):.3f} | "
            f"{sorted({rc for _, _, rc, _ in rows})} |"
        )


if __name__ == "__main__":
    main()
