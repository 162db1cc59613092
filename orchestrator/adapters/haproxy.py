"""The front proxy port over HAProxy 2.6 (Debian's package), run as its own systemd unit.

Works over either transport: files and commands go through the host's Shell, the unit through its
Systemd port. The config on disk is the desired state; ``<config>.applied`` holds the hash of the
config the running proxy loaded, so a crash between the write and the reload is repaired by the
next apply (recovery re-runs the routing step).
"""

from __future__ import annotations

from orchestrator.core.catalog import Proxy
from orchestrator.core.proxy import master_socket, sha
from orchestrator.core.secrets import redact
from orchestrator.errors import CommandFailed, ProxyError
from orchestrator.ports import Shell, Systemd

UNIT = "orchestrator-proxy.service"

# Asks HAProxy's master CLI for its processes; old workers are the ones still draining a reload.
_SHOW_PROC = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
try:
    s.connect(sys.argv[1])
except OSError:
    sys.exit(3)
s.sendall(b"show proc\\n")
s.shutdown(socket.SHUT_WR)
out = b""
while chunk := s.recv(65536):
    out += chunk
sys.stdout.write(out.decode())
"""


class HaproxyProxy:
    def __init__(self, shell: Shell, systemd: Systemd, proxy: Proxy, bind: str, unit_text: str, *,
                 python: str = "/usr/bin/python3", host: str = "") -> None:
        self.shell, self.systemd, self.proxy, self.bind = shell, systemd, proxy, bind
        self.unit_text, self.python, self.host = unit_text, python, host

    @property
    def _applied(self) -> str:
        return self.proxy.config_path + ".applied"

    def apply(self, config: str) -> bool:
        installed = self._install_unit()
        path = self.proxy.config_path
        current = self.shell.read_file(path)
        if current is None or current.decode() != config:
            self._check(config)
            self.shell.run(["mkdir", "-p", path.rsplit("/", 1)[0]], idempotent=True)
            self.shell.write_file(path, config.encode(), mode=0o644)
        applied = self.shell.read_file(self._applied)
        state = self.systemd.unit_state(UNIT)
        if state.is_active and not installed and applied is not None and applied.decode().strip() == sha(config):
            return False
        if state.is_active:
            self._systemctl("reload")
        else:
            if state.is_failed:
                self.systemd.reset_failed(UNIT)
            holder = self.port_holder()
            if holder is not None:
                raise ProxyError(holder, host=self.host, unit=UNIT)
            self._systemctl("start")
            self.systemd.enable(UNIT)
        self.shell.write_file(self._applied, (sha(config) + "\n").encode())
        return True

    def _install_unit(self) -> bool:
        if self.systemd.read_unit(UNIT) == self.unit_text:
            return False
        self.systemd.install_unit(UNIT, self.unit_text)
        self.systemd.daemon_reload()
        return True

    def _check(self, config: str) -> None:
        """`haproxy -c` on the candidate: a config HAProxy refuses never replaces the running one."""
        candidate = self.proxy.config_path + ".new"
        self.shell.run(["mkdir", "-p", candidate.rsplit("/", 1)[0]], idempotent=True)
        self.shell.write_file(candidate, config.encode(), mode=0o644)
        result = self.shell.run([self.proxy.haproxy, "-c", "-q", "-f", candidate], check=False)
        if not result.ok:
            raise ProxyError(f"HAProxy refuses the rendered config {candidate}: "
                             f"{redact(result.stderr or result.stdout).strip()[-800:]}", host=self.host)

    def _systemctl(self, verb: str) -> None:
        try:
            self.shell.run(["systemctl", verb, UNIT], timeout=60)
        except CommandFailed as exc:
            tail = self.systemd.journal_tail(UNIT, 8)
            raise ProxyError(f"systemctl {verb} {UNIT} failed (exit {exc.returncode}); journal:\n  "
                             + "\n  ".join(tail), host=self.host, unit=UNIT) from exc

    def old_workers(self) -> int:
        result = self.shell.run([self.python, "-c", _SHOW_PROC, master_socket(self.proxy)], check=False,
                                idempotent=True)
        if not result.ok:
            return 0  # no master: no proxy process left that could hold a request
        section, count = "", 0
        for line in result.stdout.splitlines():
            if line.startswith("#"):
                section = line.strip("# ").strip()
            elif line.strip() and section == "old workers":
                count += 1
        return count

    def port_holder(self) -> str | None:
        if self.systemd.unit_state(UNIT).is_active:
            return None
        port = self.proxy.port
        result = self.shell.run(["ss", "-Hltnp", f"( sport = :{port} )"], check=False, idempotent=True)
        lines = [ln for ln in result.stdout.splitlines() if _binds(ln, self.bind, port)]
        if not lines:
            return None
        users = lines[0].split("users:", 1)[1] if "users:" in lines[0] else "an unknown process"
        return (f"the proxy's port {self.bind}:{port} is already taken by {users.strip()} "
                f"(set [proxy] port, or stop that process)")


def _binds(line: str, bind: str, port: int) -> bool:
    """Whether an `ss -ltn` line's local address conflicts with bind:port."""
    fields = line.split()
    if len(fields) < 4:
        return False
    local = fields[3]
    addr = local.rsplit(":", 1)[0].strip("[]")
    wildcard = {"0.0.0.0", "*", "::"}
    return local.endswith(f":{port}") and (addr in wildcard or bind in wildcard or addr == bind)
