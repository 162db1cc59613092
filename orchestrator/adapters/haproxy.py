"""The front proxy port over HAProxy 2.6 (Debian's package), run as its own systemd unit.

Works over either transport: files and commands go through the host's Shell, the unit through its
Systemd port. The config on disk is the desired state; ``<config>.applied`` holds the hash of the
config the running proxy serves (loaded, or moved to through the runtime API: a switch between a
name's alternates, no reload), so a crash between the write and the reload or the runtime move is
repaired by the next apply (recovery re-runs the routing step).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.adapters import haproxy_master
from orchestrator.core.catalog import Proxy
from orchestrator.core.commands import Script
from orchestrator.core.haproxy_cli import (
    OldWorker,
    Procs,
    Sessions,
    draining,
    engine_servers,
    mark_commands,
    new_worker,
    parse_show_proc,
    sessions,
    withdraw_commands,
    withdrawn,
)
from orchestrator.core.observed import listens_on
from orchestrator.core.proxy import (
    DEMAND_LUA,
    PROXY_UNIT,
    HostRouting,
    lua_path,
    master_socket,
    render_routing,
    sha,
)
from orchestrator.core.proxy_move import move_commands, moved, runtime_move
from orchestrator.errors import CommandFailed, ProxyError
from orchestrator.ports import Shell, Systemd
from orchestrator.resources import template_text
from orchestrator.secrets import redact

UNIT = PROXY_UNIT
CONFIG_TEMPLATE = "haproxy.cfg.j2"
T = TypeVar("T")

# HAProxy's master CLI, asked in this process on the agent's own box and, over SSH, by this script (the
# same module's text: adapters/haproxy_master.py) run on the proxy's host.
_MASTER_CLI = Script(Path(haproxy_master.__file__).read_text(encoding="utf-8"), "HAProxy master CLI (show proc)")
RELOAD_TIMEOUT_S = 30.0  # a reload re-parses one small config: seconds at most, even on a loaded host
_POLL_S = 0.02  # a reload's new worker serves before we see it: the drain starts this much later at most
# The CLI scripts need only the standard library: isolated and without site (no venv .pth files to
# read) a start costs about half (18 ms against 37 here), and the drain runs them in a warm switch's gap.
_BARE = ("-I", "-S")
# What the applied-hash file holds while a route moves through the runtime API: no config's hash, so an
# apply after a stop in the middle reloads whatever it renders.
MOVING = b"moving at runtime: the next apply reloads\n"
SESSIONS_RETRY_S = 2.0  # a master re-executing on a reload answers again well within this


class HaproxyProxy:
    def __init__(
        self,
        shell: Shell,
        systemd: Systemd,
        proxy: Proxy,
        bind: str,
        unit_text: str,
        *,
        python: str = "/usr/bin/python3",
        host: str = "",
        local: bool = False,
    ) -> None:
        """``local``: the proxy runs on the machine of this process (the agent's box): its master CLI is
        asked from here, not by a script through the shell."""
        self.shell, self.systemd, self.proxy, self.bind = shell, systemd, proxy, bind
        self.unit_text, self.python, self.host, self.local = unit_text, python, host, local
        self._checked = ""  # the hash of the last config `prepare` had HAProxy check

    @property
    def _applied(self) -> str:
        return self.proxy.config_path + ".applied"

    def apply(self, routing: HostRouting) -> bool:
        """The FrontProxy port: ``routing`` rendered with the shipped haproxy.cfg template, then applied."""
        return self.apply_config(render_routing(routing, template_text(CONFIG_TEMPLATE), template_text(DEMAND_LUA)))

    def prepare(self, routing: HostRouting) -> None:
        """The FrontProxy port: `haproxy -c` on ``routing``'s config now (a candidate file beside the
        config, as apply checks it), remembered by its hash, so that apply of it skips the check. Not
        when the Lua it loads is not installed yet (apply installs it first, then checks)."""
        config = render_routing(routing, template_text(CONFIG_TEMPLATE), template_text(DEMAND_LUA))
        lua = lua_path(self.proxy)
        if lua in config and self.shell.read_file(lua) != template_text(DEMAND_LUA).encode():
            return
        current = self.shell.read_file(self.proxy.config_path)
        if current is not None and current.decode() == config:
            return
        self._check(config)
        self._checked = sha(config)

    def apply_config(self, config: str) -> bool:
        """Serve this rendered ``config`` (apply's second half; tests give it a config of their own)."""
        installed = self._install_unit()
        self._install_lua(config)
        path = self.proxy.config_path
        current = self.shell.read_file(path)
        running = None if current is None or installed else current.decode()
        if running is not None and running != config and self._move(running, config):
            return True
        if current is None or current.decode() != config:
            if sha(config) != self._checked:  # prepare checked this very text: not again
                self._check(config)
            self.shell.run(["mkdir", "-p", path.rsplit("/", 1)[0]], idempotent=True)
            self.shell.write_file(path, config.encode(), mode=0o644)
        applied = self.shell.read_file(self._applied)
        state = self.systemd.unit_state(UNIT)
        if state.is_active and not installed and applied is not None and applied.decode().strip() == sha(config):
            return False
        if state.is_active and installed and self._master("proc")[0] is None:
            # The unit changed where its master listens: only a restart applies it.
            self._systemctl("restart")
            self._await(lambda procs: new_worker(None, procs), "its first worker")
        elif state.is_active:
            # ExecReload only signals the master: the new config serves once the master lists a
            # worker forked after this point, so the old workers are known before the drain counts.
            before = self._await(lambda procs: procs, "its master CLI to answer before the reload")
            self._systemctl("reload")
            self._await(lambda procs: new_worker(before, procs), "a worker of the new config", before)
        else:
            if state.is_failed:
                self.systemd.reset_failed(UNIT)
            holder = self.port_holder()
            if holder is not None:
                raise ProxyError(holder, host=self.host, unit=UNIT)
            self._systemctl("start")
            self._await(lambda procs: new_worker(None, procs), "its first worker")
            self.systemd.enable(UNIT)
        self.shell.write_file(self._applied, (sha(config) + "\n").encode())
        return True

    def move(self, routing: HostRouting) -> bool:
        """The FrontProxy port: ``routing`` served through the runtime API alone (``_move``), where the
        unit is the one installed and the new config differs from the running one only in server
        states; False where a reload is needed, nothing done then. A move that wrote the file and then
        could not prove its state change also answers False: the hash it cleared makes the caller's
        ``apply`` reload that file (and ``withdraw`` refuse)."""
        config = render_routing(routing, template_text(CONFIG_TEMPLATE), template_text(DEMAND_LUA))
        current = self.shell.read_file(self.proxy.config_path)
        if current is None or current.decode() == config or self.systemd.read_unit(UNIT) != self.unit_text:
            return False
        return self._move(current.decode(), config)

    def _move(self, running: str, config: str) -> bool:
        """Serve ``config`` through the runtime API, no reload, where it differs from the ``running``
        one (the file, which the proxy runs as the applied hash says) only in which engine servers are
        disabled (core/proxy_move.py). The order makes every stop in between safe: the applied hash is
        cleared first (an agent killed anywhere below leaves a proxy whose next apply reloads), the new
        file is written before the running worker changes (a restart of HAProxy meanwhile loads the new
        routing, never the old one back), and the hash is written once ``show stat`` proved the change.
        False when it could not (then apply reloads the file, already written)."""
        applied = self.shell.read_file(self._applied)
        changes = runtime_move(running, config)
        if (
            not changes
            or applied is None
            or applied.decode().strip() != sha(running)
            or not self.systemd.unit_state(UNIT).is_active
        ):
            return False
        self.shell.write_file(self._applied, MOVING)
        self.shell.write_file(self.proxy.config_path, config.encode(), mode=0o644)
        said = self._master_cli("proc", *move_commands(changes)).get("said") or [""]
        if not moved(str(said[-1]), changes):
            return False
        self.shell.write_file(self._applied, (sha(config) + "\n").encode())
        return True

    def stop(self) -> bool:
        state = self.systemd.unit_state(UNIT)
        if not state.exists:
            return False
        if state.is_active:
            self._systemctl("stop")
        elif state.is_failed:
            self.systemd.reset_failed(UNIT)
        self.systemd.disable(UNIT)
        return state.is_active

    def _install_unit(self) -> bool:
        if self.systemd.read_unit(UNIT) == self.unit_text:
            return False
        self.systemd.install_unit(UNIT, self.unit_text)
        self.systemd.daemon_reload()
        return True

    def _install_lua(self, config: str) -> None:
        """The hold's Lua beside the config that loads it, before `haproxy -c` reads both (the config
        carries its hash, so a new Lua changes the config and reloads the proxy)."""
        path = lua_path(self.proxy)
        if path not in config:
            return
        text = template_text(DEMAND_LUA).encode()
        if self.shell.read_file(path) != text:
            self.shell.run(["mkdir", "-p", path.rsplit("/", 1)[0]], idempotent=True)
            self.shell.write_file(path, text, mode=0o644)

    def _check(self, config: str) -> None:
        """`haproxy -c` on the candidate: a config HAProxy refuses never replaces the running one."""
        candidate = self.proxy.config_path + ".new"
        self.shell.run(["mkdir", "-p", candidate.rsplit("/", 1)[0]], idempotent=True)
        self.shell.write_file(candidate, config.encode(), mode=0o644)
        result = self.shell.run([self.proxy.haproxy, "-c", "-q", "-f", candidate], check=False)
        if not result.ok:
            raise ProxyError(
                f"HAProxy refuses the rendered config {candidate}: "
                f"{redact(result.stderr or result.stdout).strip()[-800:]}",
                host=self.host,
            )

    def _systemctl(self, verb: str) -> None:
        try:
            self.shell.run(["systemctl", verb, UNIT], timeout=60)
        except CommandFailed as exc:
            tail = self.systemd.journal_tail(UNIT, 8)
            raise ProxyError(
                f"systemctl {verb} {UNIT} failed (exit {exc.returncode}); journal:\n  " + "\n  ".join(tail),
                host=self.host,
                unit=UNIT,
            ) from exc

    def _master(self, mode: str, *commands: str) -> tuple[Procs | None, dict[int, OldWorker]]:
        out = self._master_cli(mode, *commands)
        procs = parse_show_proc(out.get("proc") or "")
        workers = {
            int(pid): OldWorker(int(pid), str(v.get("info", "")), str(v.get("stat", "")), str(v.get("marks", "")))
            for pid, v in (out.get("old") or {}).items()
        }
        return procs, workers

    def _master_cli(self, mode: str, *commands: str) -> dict[str, Any]:
        sock = master_socket(self.proxy)
        if self.local:
            return haproxy_master.master(sock, mode, list(commands))
        result = self.shell.run(
            [self.python, *_BARE, "-c", _MASTER_CLI, "master", sock, mode, *commands], check=False, idempotent=True
        )
        try:
            out = json.loads(result.stdout) if result.ok else {}
        except ValueError:
            out = {}
        return out if isinstance(out, dict) else {}

    def withdraw(self, engines: Sequence[tuple[str, int]]) -> bool:
        """Models on demand: the running worker stops routing to ``engines`` now (runtime API, no reload);
        False (nothing done: reload instead) unless the proxy runs the config on disk. The applied hash
        is cleared first, so the next apply reloads whatever it renders (a crash in between included)."""
        path = self.proxy.config_path
        config, applied = self.shell.read_file(path), self.shell.read_file(self._applied)
        if (
            config is None
            or applied is None
            or applied.decode().strip() != sha(config.decode())
            or not self.systemd.unit_state(UNIT).is_active
        ):
            return False
        servers = engine_servers(config.decode(), engines)
        if not servers:
            return False  # not in the config it runs, as far as it reads: a reload is the sure way
        self.shell.write_file(self._applied, b"withdrawn at runtime: the next apply reloads\n")
        said = self._master_cli("proc", *withdraw_commands(servers)).get("said") or [""]
        return withdrawn(str(said[-1]), servers)

    def _await(self, done: Callable[[Procs | None], T | None], what: str, before: Procs | None = None) -> T:
        """Poll the master CLI until ``done`` gives a value; a failed reload or the deadline raise."""
        deadline = time.monotonic() + RELOAD_TIMEOUT_S
        while True:
            procs, _ = self._master("proc")
            value = done(procs)
            if value is not None:
                return value
            if before is not None and procs is not None and procs.failed > before.failed:
                raise ProxyError(
                    f"HAProxy's master could not load {self.proxy.config_path} on reload (failed "
                    f"reloads {before.failed} -> {procs.failed}); the old config still serves; "
                    "journal:\n  " + "\n  ".join(self.systemd.journal_tail(UNIT, 8)),
                    host=self.host,
                    unit=UNIT,
                )
            if time.monotonic() > deadline:
                raise ProxyError(
                    f"{UNIT}: no {what} on {master_socket(self.proxy)} within {RELOAD_TIMEOUT_S:g} s "
                    f"(last `show proc`: {procs}); journal:\n  " + "\n  ".join(self.systemd.journal_tail(UNIT, 8)),
                    host=self.host,
                    unit=UNIT,
                )
            time.sleep(_POLL_S)

    def draining(self, engines: Sequence[tuple[str, int]]) -> int | None:
        procs, workers = self._master("old")
        marks = mark_commands(workers, engines)
        if marks:  # then read again: a request in flight to the engines shows as a session from now on
            procs, workers = self._master("old", *marks)
        if procs is None:
            # No master: no proxy process is left that could hold a request, unless the unit
            # runs and the master is only re-executing (unknown: ask again).
            return None if self.systemd.unit_state(UNIT).is_active else 0
        return draining(procs, workers, engines)

    def sessions(self, engines: Sequence[tuple[str, int]]) -> dict[tuple[str, int], Sessions]:
        # A reload re-executes the master, whose CLI answers nothing meanwhile (a swap reloads twice):
        # ask again for a while before saying the proxy gave no figures.
        deadline = time.monotonic() + SESSIONS_RETRY_S
        while True:
            answers: object = None
            if self.local:
                answers = haproxy_master.stats(master_socket(self.proxy))
            else:
                result = self.shell.run(
                    [self.python, *_BARE, "-c", _MASTER_CLI, "stats", master_socket(self.proxy)],
                    check=False,
                    idempotent=True,
                )
                try:
                    answers = json.loads(result.stdout) if result.ok else None
                except ValueError:
                    answers = None
            if isinstance(answers, list):
                return sessions([str(a) for a in answers], engines)
            if time.monotonic() > deadline:  # no master answered (it re-executes on a reload, or is gone)
                raise ProxyError(
                    f"HAProxy's master CLI {master_socket(self.proxy)} gave no `show stat` for {SESSIONS_RETRY_S:g} s",
                    host=self.host,
                )
            time.sleep(_POLL_S)

    def port_holder(self) -> str | None:
        if self.systemd.unit_state(UNIT).is_active:
            return None
        port = self.proxy.port
        result = self.shell.run(["ss", "-Hltnp", f"( sport = :{port} )"], check=False, idempotent=True)
        lines = [ln for ln in result.stdout.splitlines() if listens_on(ln, self.bind, port)]
        if not lines:
            return None
        users = lines[0].split("users:", 1)[1] if "users:" in lines[0] else "an unknown process"
        return (
            f"the proxy's port {self.bind}:{port} is already taken by {users.strip()} "
            f"(set [proxy] port, or stop that process)"
        )
