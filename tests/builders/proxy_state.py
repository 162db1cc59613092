"""What the front proxy in a test host runs, read from HAProxy itself (its master CLI) beside what its
files say: whether a route move reloaded, and whether the file on disk routes as the running worker."""

from __future__ import annotations

import json
from dataclasses import dataclass

from orchestrator.core.proxy import sha
from orchestrator.core.proxy_move import server_states
from tests.hosts.machine import Host

CONFIG = "/etc/orchestrator/haproxy.cfg"
MASTER = "/run/orchestrator-proxy/master.sock"
_READ = (
    "import json, sys; from orchestrator.adapters.haproxy_master import ask; "
    "from orchestrator.core.haproxy_cli import parse_show_proc, stat_rows; "
    "p = parse_show_proc(ask(sys.argv[1], 'show proc') or ''); "
    "rows = [r for r in stat_rows(ask(sys.argv[1], '@1 show stat') or '') "
    "if r['svname'] not in ('FRONTEND', 'BACKEND')]; "
    "print(json.dumps({'reloads': p.reloads if p else None, 'workers': list(p.workers) if p else None, "
    "'servers': [[r['pxname'], r['svname'], not r['status'].startswith('MAINT'), r['addr']] for r in rows]}))"
)


@dataclass(frozen=True)
class ProxyState:
    reloads: int | None  # the master's reload count
    workers: tuple[int, ...]  # the current worker(s)
    running: dict[tuple[str, str], bool]  # each backend server of the current worker: serving (not MAINT)
    addresses: dict[tuple[str, str], str]  # each backend server's address, as HAProxy has it
    config: str  # the file on disk
    applied: str  # its .applied file

    @property
    def file_matches_running(self) -> bool:
        """The file's servers and their enabled states are the running worker's, and its hash is applied."""
        return server_states(self.config) == self.running and self.applied.strip() == sha(self.config)

    def serving(self, backend: str = "m1") -> list[str]:
        """The addresses the running worker sends ``backend``'s requests to."""
        return sorted(
            a for (b, s), a in self.addresses.items() if b == backend and s != "current" and self.running[(b, s)]
        )


def proxy_state(host: Host) -> ProxyState:
    out = json.loads(host.run_python(_READ, MASTER).stdout)
    servers = out["servers"]
    return ProxyState(
        out["reloads"],
        tuple(out["workers"] or ()),
        {(b, s): bool(up) for b, s, up, _ in servers},
        {(b, s): str(a) for b, s, _, a in servers},
        host.run(["cat", CONFIG]).stdout,
        host.run(["cat", CONFIG + ".applied"], check=False).stdout,
    )
