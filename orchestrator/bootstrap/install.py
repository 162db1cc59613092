"""`orchestrator agent install`: the agent on a box over one SSH connection, idempotently.

Layout on the box (nothing outside it but the group, the state directory, the config and the unit):

    /opt/orchestrator/wheels/           dependency wheels (copied once; only missing files travel)
    /opt/orchestrator/dist/<fp>/        the orchestrator wheel of content fingerprint <fp>
    /opt/orchestrator/venvs/<fp>/       a venv (--system-site-packages, for the distribution's python3-gi)
    /opt/orchestrator/venv -> venvs/<fp>   the current one (what `--host` clients run the relay with)

The unit runs the agent with the python of ``venvs/<fp>``, not of the link: an upgrade builds the
next venv beside the running one, so the running agent never imports a file of another version;
the link flips and the agent restarts only when no operation runs (else exit 5 naming it).
Each step observes before it acts and says whether it changed anything.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import settings
from orchestrator.adapters.ssh import SshShell
from orchestrator.agent.loadout import build
from orchestrator.bootstrap import wheels
from orchestrator.bootstrap.controller_keys import ControllerKeys, Reach
from orchestrator.core.catalog import Catalog
from orchestrator.core.render import render_agent_unit
from orchestrator.errors import AgentError, Busy, ConfigError, OrchestratorError, UsageError
from orchestrator.resources import template_text

PREFIX = "/opt/orchestrator"
CONFIG = "/etc/orchestrator/deploy.toml"
UNIT = "orchestrator-agent.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
READY_TIMEOUT_S = 60.0
KEEP_VENVS = 2  # the current one and the one before it (a manual way back)

Progress = Callable[[str], None]


@dataclass
class Step:
    name: str
    changed: bool
    detail: str


@dataclass
class Options:
    upgrade: bool = False
    config_text: str | None = None  # --config FILE's text (validated before connecting)
    config_name: str = ""
    base_python: str = "/usr/bin/python3"
    source: str | None = None
    wheel: str | None = None
    wheelhouse: str | None = None
    # a controller's group hosts: reached from here to authorize its key (None: printed, not authorized)
    authorize: Reach | None = None


@dataclass
class Report:
    host: str
    steps: list[Step] = field(default_factory=list)
    version: str = ""
    fingerprint: str = ""
    python: str = ""
    controller_keys: dict[str, str] = field(default_factory=dict)  # a controller's key paths -> public lines

    @property
    def changed(self) -> bool:
        return any(s.changed for s in self.steps)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "changed": self.changed,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "python": self.python,
            "controller_keys": self.controller_keys,
            "steps": [{"step": s.name, "changed": s.changed, "detail": s.detail} for s in self.steps],
        }


def validate_config(text: str, name: str) -> Catalog:
    """The file as the agent will read it at start (exit 2 on any error, before anything is sent)."""
    with tempfile.TemporaryDirectory(prefix="orchestrator-install-") as tmp:
        path = Path(tmp) / "deploy.toml"
        path.write_text(text)
        try:
            return build(settings.load(path), time.time()).catalog
        except ConfigError as exc:  # a DocumentError too, whose class takes other arguments
            raise ConfigError(str(exc).replace(str(path), name)) from None
        except OrchestratorError as exc:
            raise type(exc)(str(exc).replace(str(path), name)) from None


def minimal_config(hostname: str, gpus: list[float]) -> str:
    """A deploy.toml for a fresh box: the box itself over D-Bus, its GPUs as nvidia-smi reports them."""
    name = re.sub(r"[^a-z0-9._-]", "-", hostname.lower()).strip("-._") or "box"
    memory = f"gpu_memory_gib = {min(gpus) / 1024:.1f}\n" if gpus else ""
    return (
        "# Written by `orchestrator agent install`: this box's configuration. Add [models.*] and change it\n"
        "# with `orchestrator --host ... config push FILE` (validated, recorded, previous file kept).\n"
        'state_dir = "/var/lib/orchestrator"\nsocket_group = "orchestrator"\n\n'
        f'[hosts.{name}]\ntransport = "local"\ngpus = {len(gpus)}\n{memory}'
    )


class Installer:
    """The steps of one `agent install` on one box, through one SSH connection."""

    def __init__(self, shell: SshShell, opts: Options, progress: Progress) -> None:
        self.sh = shell
        self.opts = opts
        self.say = progress
        self.report = Report(host=shell.where)
        self.facts: dict[str, str] = {}

    # -- helpers ------------------------------------------------------------------------------------

    def _run(self, script: str, *, timeout: float = 300.0) -> str:
        return self.sh.run(["sh", "-c", script], timeout=timeout).stdout

    def _step(self, name: str, changed: bool, detail: str) -> None:
        self.report.steps.append(Step(name, changed, detail))
        self.say(f"{name}: {detail}")

    def _agent_call(self, python: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """One request to the box's agent through the relay, on this same SSH connection."""
        request = json.dumps({"op": op, "args": args})
        script = (
            f"printf '%s\\n' {shlex.quote(request)} | {shlex.quote(python)} -m orchestrator.agent.relay "
            f"--config {CONFIG}"
        )
        result = self.sh.run(["sh", "-c", script], check=False, timeout=30)
        for line in result.stdout.splitlines():
            msg = json.loads(line)
            if "result" in msg:
                return dict(msg["result"])
            if "error" in msg:
                raise AgentError(f"agent on {self.sh.where}: {msg['error'].get('message')}")
        last = (result.stderr.strip().splitlines() or [f"relay exited {result.exit_code}"])[-1]
        raise AgentError(f"agent on {self.sh.where}: {last.removeprefix('error: ')}")

    # -- the steps ----------------------------------------------------------------------------------

    def probe(self) -> None:
        py = shlex.quote(self.opts.base_python)
        out = self._run(
            f"echo \"python=$({py} -c 'import sys, platform; v = sys.version_info; "
            f'print(f"cp{{v[0]}}{{v[1]}}-{{platform.machine()}}")\' 2>/dev/null)"\n'
            f'echo "gi=$({py} -c "import gi, venv, ensurepip" 2>/dev/null && echo yes)"\n'
            f'echo "current=$(readlink {PREFIX}/venv 2>/dev/null)"\n'
            f'echo "config=$(test -f {CONFIG} && echo yes)"\n'
            f'echo "active=$(systemctl is-active {UNIT} 2>/dev/null)"\n'
            f'echo "enabled=$(systemctl is-enabled {UNIT} 2>/dev/null)"\n'
            'echo "hostname=$(hostname -s)"\n'
            'echo "gpus=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null '
            '| tr -d " " | paste -sd, -)"\n'
        )
        self.facts = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        if not self.facts.get("python"):
            raise UsageError(
                f"host {self.sh.where}: no Python at {self.opts.base_python} (pass --python PATH "
                "of a Python >= 3.11 on the box)"
            )
        if not self.facts.get("gi"):
            self._apt_gi()

    def _apt_gi(self) -> None:
        """python3-gi (pydbus' GLib binding, compiled by the distribution) and venv support from apt."""
        self.say("box python lacks gi or venv: apt-get install python3-gi python3-venv")
        apt = (
            "command -v apt-get >/dev/null && DEBIAN_FRONTEND=noninteractive "
            "apt-get install -y --no-install-recommends python3-gi python3-venv"
        )
        res = self.sh.run(["sh", "-c", apt], check=False, timeout=600)
        if not res.ok:
            raise OrchestratorError(
                f"host {self.sh.where}: {self.opts.base_python} cannot import gi/venv and "
                "`apt-get install python3-gi python3-venv` failed; install them (or "
                "PyGObject for that Python) and run again"
            )
        self._step("system packages", True, "installed python3-gi python3-venv")

    def package(self) -> tuple[wheels.PackageWheel, bool]:
        """Build (or read) the wheel; install it into venvs/<fp> when needed. Returns (wheel, new venv)."""
        with tempfile.TemporaryDirectory(prefix="orchestrator-wheel-") as tmp:
            if self.opts.wheel:
                pkg = wheels.inspect(Path(self.opts.wheel))
            else:
                tree = wheels.source_tree(self.opts.source)
                self.say(f"building the wheel of {tree}")
                pkg = wheels.build(tree, Path(tmp))
            self.report.version, self.report.fingerprint = pkg.version, pkg.short
            current = self.facts.get("current", "").rsplit("/", 1)[-1]
            if current == pkg.short:
                self._step("package", False, f"orchestrator {pkg.version} ({pkg.short}) already installed")
                return pkg, False
            if current and not self.opts.upgrade:
                self._step(
                    "package", False, f"kept the installed {current} (this tree is {pkg.short}: --upgrade replaces it)"
                )
                self.report.fingerprint = current
                return pkg, False
            if current:
                self.ensure_idle()
            self._install(pkg)
            return pkg, True

    def _install(self, pkg: wheels.PackageWheel) -> None:
        tag = self.facts["python"]
        if self.opts.wheelhouse:
            deps = sorted(Path(self.opts.wheelhouse).glob("*.whl"))
            if not deps:
                raise UsageError(f"--wheelhouse {self.opts.wheelhouse}: holds no *.whl")
        elif tag != wheels.interpreter_tag():
            raise UsageError(
                f"host {self.sh.where}: its Python is {tag}, this machine's {wheels.interpreter_tag()}: "
                "the dependency wheels built here would not fit; run from a machine with the same "
                "Python or pass --wheelhouse DIR with wheels for the box"
            )
        else:
            cache = wheels.default_cache()
            self.say(f"dependency wheels: resolving into {cache}")
            deps = wheels.dependencies(pkg, cache)
        sent = self._ship(pkg, deps)
        venv, dist = f"{PREFIX}/venvs/{pkg.short}", f"{PREFIX}/dist/{pkg.short}"
        self.say(f"creating {venv} and installing {len(deps) + 1} wheels offline")
        reqs = " ".join(shlex.quote(r) for r in wheels.EXTRA_REQUIREMENTS)
        self._run(
            f"set -e; rm -rf {venv}; {shlex.quote(self.opts.base_python)} -m venv --system-site-packages "
            f"{venv}; PIP_CONFIG_FILE=/dev/null {venv}/bin/python -m pip install -q --no-index "
            f"--no-cache-dir --disable-pip-version-check --ignore-installed --find-links {PREFIX}/wheels "
            f"{dist}/{pkg.path.name} {reqs}; {venv}/bin/python -c 'import orchestrator.cli, pydbus, gi'",
            timeout=900,
        )
        self._step(
            "package", True, f"orchestrator {pkg.version} ({pkg.short}) installed in {venv} ({sent} files copied)"
        )

    def _ship(self, pkg: wheels.PackageWheel, deps: list[Path]) -> int:
        """Copy the wheels the box lacks (by name and size) over the SSH connection's SFTP."""
        listing = self._run(
            f"mkdir -p {PREFIX}/wheels {PREFIX}/dist/{pkg.short} && "
            f"find {PREFIX}/wheels {PREFIX}/dist/{pkg.short} -maxdepth 1 -name '*.whl' "
            "-printf '%p %s\\n'"
        )
        have = {tuple(line.rsplit(" ", 1)) for line in listing.splitlines()}
        todo = [(d, f"{PREFIX}/wheels/{d.name}") for d in deps]
        todo.append((pkg.path, f"{PREFIX}/dist/{pkg.short}/{pkg.path.name}"))
        sent = 0
        for local, remote in todo:
            data = local.read_bytes()
            if (remote, str(len(data))) not in have:
                self.sh.write_file(remote, data)
                sent += 1
        self.say(f"wheels on the box: {sent} copied, {len(todo) - sent} already there")
        return sent

    def ensure_idle(self) -> None:
        """An upgrade restarts the agent only between operations: a running one is refused (exit 5)."""
        if self.facts.get("active") != "active":
            return
        status = self._agent_call(f"{PREFIX}/venv/bin/python", "status", {"host": None})
        running = [
            f"{d['model']} (revision {d['revision']}, phase {d['phase']}, by {d['trigger']}) on {h}"
            for h, entry in status.get("hosts", {}).items()
            for d in entry.get("running", [])
        ]
        ops = status.get("agent", {}).get("running") or {}
        if running or ops:
            what = "; ".join(running) or ", ".join(f"{op} on {h}" for h, op in ops.items())
            raise Busy(
                f"host {self.sh.where}: the agent is running {what}: an upgrade restarts it only "
                "between operations; run it again when that ends (`orchestrator --host ... status "
                "--follow`)"
            )

    def group_and_state(self, catalog: Catalog) -> None:
        """The socket group and the state directory (an existing one is left as it is: when it is
        /var/lib/orchestrator, the unit's StateDirectory= owns its ownership and mode)."""
        group, state = shlex.quote(catalog.socket_group), shlex.quote(catalog.state_dir)
        out = self._run(
            f"made=''; getent group {group} >/dev/null || {{ groupadd --system {group}; made=group; }}; "
            f'test -d {state} || {{ install -d -m 0750 -g {group} {state}; made="$made state"; }}; '
            "echo $made"
        )
        made = out.split()
        self._step("group", "group" in made, f"{catalog.socket_group} " + ("created" if "group" in made else "exists"))
        self._step("state dir", "state" in made, f"{catalog.state_dir} " + ("created" if "state" in made else "exists"))

    def config(self) -> Catalog:
        if self.facts.get("config"):
            text = (self.sh.read_file(CONFIG) or b"").decode()
            catalog = validate_config(text, f"{self.sh.where}:{CONFIG}")
            differs = self.opts.config_text is not None and self.opts.config_text != text
            note = f" ({self.opts.config_name} differs: `config push` replaces it)" if differs else ""
            self._step("config", False, f"{CONFIG} kept{note}")
            return catalog
        if self.opts.config_text is not None:
            text, origin = self.opts.config_text, self.opts.config_name
        else:
            gpus = [float(g) for g in self.facts.get("gpus", "").split(",") if g.strip()]
            text, origin = minimal_config(self.facts.get("hostname", "box"), gpus), "a minimal one for this box"
        catalog = validate_config(text, origin)
        self._run(f"mkdir -p {Path(CONFIG).parent}")
        self.sh.write_file(CONFIG, text.encode(), mode=0o640)
        self._step("config", True, f"{CONFIG} written from {origin}")
        return catalog

    def unit(self, catalog: Catalog, python: str) -> bool:
        text = render_agent_unit(
            catalog, template_text("orchestrator-agent.service.j2"), python=python, config=CONFIG
        ).text
        old = self.sh.read_file(UNIT_PATH)
        if old is not None and old.decode() == text:
            self._step("unit", False, f"{UNIT_PATH} up to date")
            return False
        self.sh.write_file(UNIT_PATH, text.encode())
        self._run("systemctl daemon-reload")
        self._step("unit", True, f"{UNIT_PATH} written (python {python}), daemon-reload")
        return True

    def service(self, pkg_short: str, restart: bool) -> None:
        link = f"{PREFIX}/venv"
        self._run(f"ln -sfn venvs/{pkg_short} {link}.new && mv -T {link}.new {link}")
        actions = []
        if self.facts.get("enabled") != "enabled":
            self._run(f"systemctl enable --quiet {UNIT}")
            actions.append("enabled")
        if self.facts.get("active") != "active":
            self._run(f"systemctl start {UNIT}", timeout=READY_TIMEOUT_S + 30)
            actions.append("started")
        elif restart:
            self.ensure_idle()
            self._run(f"systemctl restart {UNIT}", timeout=READY_TIMEOUT_S + 180)
            actions.append("restarted")
        self._step("service", bool(actions), f"{UNIT} " + (", ".join(actions) if actions else "enabled and active"))

    def wait_ready(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + READY_TIMEOUT_S
        while True:
            try:
                status = self._agent_call(f"{PREFIX}/venv/bin/python", "status", {"host": None})
                break
            except AgentError as exc:
                if time.monotonic() > deadline:
                    journal = self.sh.run(["journalctl", "-u", UNIT, "-n", "15", "--no-pager"], check=False).stdout
                    raise AgentError(f"{exc}; not ready after {READY_TIMEOUT_S:g} s. Journal:\n{journal}") from None
                time.sleep(0.2)
        pid = status.get("agent", {}).get("pid")
        self.say(
            f"agent ready: pid {pid}, hosts {', '.join(sorted(status.get('hosts', {})))} "
            f"({time.monotonic() - t0:.1f} s)"
        )

    def run(self) -> Report:
        self.sh.connect()
        self.say(f"connected to {self.sh.where} (host key checked)")
        self.probe()
        pkg, new_venv = self.package()
        current = self.facts.get("current", "").rsplit("/", 1)[-1]
        short = pkg.short if new_venv or not current else current
        self.report.python = python = f"{PREFIX}/venvs/{short}/bin/python"
        catalog = self.config()
        if catalog.groups:  # a fleet's controller: its own SSH identity for the group's hosts
            self.report.controller_keys = ControllerKeys(self.sh, self._step, self.say).setup(
                catalog, self.opts.authorize
            )
        self.group_and_state(catalog)
        unit_changed = self.unit(catalog, python)
        self.service(short, restart=new_venv or unit_changed)
        self.wait_ready()
        if new_venv:
            self._run(
                f"cd {PREFIX}/venvs && ls -1t | grep -vxF {short} | tail -n +{KEEP_VENVS} "
                f'| while read -r old; do rm -rf "$old" "../dist/$old"; done'
            )
        return self.report
