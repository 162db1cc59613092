"""One test host: systemd-nspawn booting the machine's own root through a tmpfs overlay.

The host shares the machine's network namespace, so every service in it binds to its own
loopback address (sshd on <address>:22). Nothing written inside reaches the machine's disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The checkout appears in every test host at its own path and at this one, outside /tmp and
# /var/tmp: vLLM units run with PrivateTmp=yes and would not see an engine under a checkout that
# lives in /tmp (a fresh clone often does). Unit commands name the engine through in_host().
IN_HOST_REPO = Path("/run/orchestrator-src")
STANDIN_NVSMI = REPO / "tests" / "standin" / "nvidia_smi.py"
DEFAULT_GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
DEFAULT_GPUS: dict[str, object] = {"count": 8, "memory_mib": 97887, "name": DEFAULT_GPU_NAME}
# Where the machine's systemd generators are (masked in hosts: see Host.prepare).
GENERATOR_DIRS = (
    "/usr/lib/systemd/system-generators",
    "/lib/systemd/system-generators",
    "/usr/local/lib/systemd/system-generators",
    "/etc/systemd/system-generators",
)
# Units enabled on the machine that must not start in a host (ports, timers, consoles).
KEEP_ENABLED = {"ssh.service", "sshd.service"}
EXTRA_MASKS = [
    "postgresql@.service",
    "console-getty.service",
    "getty@.service",
    "container-getty@.service",
    "systemd-timesyncd.service",
    "apt-daily.service",
    "apt-daily-upgrade.service",
    # Remounts the overlay root from an empty fstab: nothing to do, and it failed now
    # and then when several hosts booted at once.
    "systemd-remount-fs.service",
]


def repo_binds() -> tuple[str, ...]:
    """--bind-ro values that show the checkout inside a host: at its own path and at IN_HOST_REPO."""
    return (str(REPO), f"{REPO}:{IN_HOST_REPO}")


def in_host(path: str | Path) -> str:
    """The path a unit inside a test host uses for ``path`` (a file of the checkout or its venv).

    Only the parent directory is resolved: the venv's ``python`` is a symlink that must stay in the
    venv, or the interpreter would not find its site-packages.
    """
    given = Path(path)
    try:
        rel = (given.parent.resolve() / given.name).relative_to(REPO)
    except ValueError:
        return str(given)  # outside the checkout: seen at the same path through the overlay root
    return str(IN_HOST_REPO / rel)


class HostError(RuntimeError):
    """The harness could not boot, reach or tear down a host."""


@dataclass
class Host:
    """A booted (or booting) test host; ``run`` executes a shell command in it over SSH."""

    name: str  # logical name, h1..hN
    address: str
    state_dir: Path  # mounts live here: rw (tmpfs), root (overlay)
    key_path: Path
    known_hosts_path: Path
    host_key_path: Path
    port: int = 22
    user: str = "root"
    binds_ro: tuple[str, ...] = field(default_factory=repo_binds)
    binds_rw: tuple[str, ...] = ()
    netns: str | None = None  # /run/netns/<name> when the host has a network namespace of its own
    nspawn_pid: int = 0
    boot_seconds: float = 0.0
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def machine(self) -> str:
        """The nspawn machine name (also the host's hostname): unique per loopback address."""
        return f"th{self.address.rsplit('.', 1)[1]}"

    @property
    def root(self) -> Path:
        return self.state_dir / "root"

    @property
    def rw(self) -> Path:
        return self.state_dir / "rw"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "console.log"

    @property
    def python(self) -> str:
        """The project's venv interpreter, visible inside the host through the repo bind."""
        return str(REPO / ".venv" / "bin" / "python")

    # -- commands -------------------------------------------------------------------------------

    @property
    def control_path(self) -> Path:
        """The socket of the harness's one shared SSH connection to this host (in the run's key folder)."""
        return self.key_path.parent / f"cm-{self.machine}"

    def ssh_argv(self, *, batch: bool = True, shared: bool = False) -> list[str]:
        """OpenSSH client argv (without the command) that checks the host key strictly.

        shared=True multiplexes over one connection per host (ControlMaster): a fresh handshake costs
        ~0.35 s and ~80 ms of client CPU here, a session on the shared connection ~20 ms and 5 ms, and
        the harness runs thousands of commands. Left out by default: benches measure plain SSH."""
        argv = [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.key_path),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts_path}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "ConnectTimeout=5",
            "-o",
            "LogLevel=ERROR",
            "-p",
            str(self.port),
            f"{self.user}@{self.address}",
        ]
        if batch:
            argv[1:1] = ["-o", "BatchMode=yes"]
        if shared:
            # auto: the first command becomes the master; once sshd drops it (an outage test kills
            # sshd), the next command connects afresh and becomes the master again.
            argv[1:1] = [
                "-o",
                "ControlMaster=auto",
                "-o",
                f"ControlPath={self.control_path}",
                "-o",
                "ControlPersist=300",
            ]
        return argv

    def close_shared_connection(self) -> None:
        """End the shared SSH connection's master process (the host is going away)."""
        if self.control_path.exists():
            subprocess.run(
                [
                    "ssh",
                    "-F",
                    "/dev/null",
                    "-o",
                    f"ControlPath={self.control_path}",
                    "-O",
                    "exit",
                    f"{self.user}@{self.address}",
                ],
                check=False,
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=10,
            )

    def run(
        self, cmd: str | Sequence[str], *, check: bool = True, input: str | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run cmd in the host (a string goes to the remote shell as is; a list is quoted)."""
        line = cmd if isinstance(cmd, str) else shlex.join(cmd)
        proc = subprocess.run(
            [*self.ssh_argv(shared=True), "--", line],
            check=False,
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise HostError(
                f"{self.name} ({self.address}): {line!r} exited {proc.returncode}:\n"
                f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        return proc

    def run_python(
        self, code: str, *args: str, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a Python snippet inside the host with the project's venv and the repo importable."""
        return self.run(self.python_command("-c", code, *args), check=check, timeout=timeout)

    def python_command(self, *args: str) -> str:
        """A remote shell line running the venv's Python in the repo with the package importable."""
        return (
            f"cd {shlex.quote(str(REPO))} && PYTHONPATH={shlex.quote(str(REPO))} "
            f"PYTHONDONTWRITEBYTECODE=1 exec {shlex.join([self.python, *args])}"
        )

    def write_file(self, path: str, data: str, mode: int = 0o644) -> None:
        """Write a file inside the host (a test's setup step)."""
        self.run(
            f"umask 022; mkdir -p {shlex.quote(os.path.dirname(path))} && cat > {shlex.quote(path)}"
            f" && chmod {mode:o} {shlex.quote(path)}",
            input=data,
        )

    def set_gpus(self, count: int = 8, memory_mib: int = 97887, name: str = DEFAULT_GPU_NAME) -> None:
        """What the stand-in nvidia-smi reports as this host's GPUs."""
        self.write_file(
            "/run/standin-gpu/gpus.json", json.dumps({"count": count, "memory_mib": memory_mib, "name": name})
        )

    def reset(self) -> None:
        """Back to the state right after boot: test units stopped and removed, GPUs default."""
        self.run(_RESET_SCRIPT.replace("@GPUS@", shlex.quote(json.dumps(DEFAULT_GPUS))), timeout=120)

    # -- lifecycle ------------------------------------------------------------------------------

    def prepare(self, client_public_key: str) -> None:
        """Mount the overlay and write everything the host needs before it boots."""
        self.rw.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        _sh(["mount", "-t", "tmpfs", "-o", "mode=0755", f"testhost-{self.machine}", str(self.rw)])
        (self.rw / "upper").mkdir()
        (self.rw / "work").mkdir()
        _sh(
            [
                "mount",
                "-t",
                "overlay",
                f"testhost-{self.machine}",
                "-o",
                f"lowerdir=/,upperdir={self.rw}/upper,workdir={self.rw}/work",
                str(self.root),
            ]
        )
        root = self.root
        (root / "etc/hostname").write_text(self.machine + "\n")
        # The machine's /root/.bashrc runs `pyenv init`, whose rehash waits on a lock file that a
        # killed command leaves behind: every later ssh command would then stall for a minute.
        (root / "root/.bashrc").write_text("# test host: no pyenv/cargo set-up in non-interactive shells\n")
        (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
        ssh_dir = root / "etc/ssh"
        for old in ssh_dir.glob("ssh_host_*"):
            old.unlink()
        shutil.copy(self.host_key_path, ssh_dir / "ssh_host_ed25519_key")
        shutil.copy(
            self.host_key_path.with_name(self.host_key_path.name + ".pub"), ssh_dir / "ssh_host_ed25519_key.pub"
        )
        os.chmod(ssh_dir / "ssh_host_ed25519_key", 0o600)
        (ssh_dir / "testhost_authorized_keys").write_text(client_public_key + "\n")
        (ssh_dir / "sshd_config.d").mkdir(exist_ok=True)
        (ssh_dir / "sshd_config.d/00-testhost.conf").write_text(
            f"Port {self.port}\nListenAddress {self.address}\n"
            "HostKey /etc/ssh/ssh_host_ed25519_key\n"
            "AuthorizedKeysFile /etc/ssh/testhost_authorized_keys\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nUseDNS no\nMaxStartups 100:30:200\nMaxSessions 100\n"
        )
        (root / "etc/tmpfiles.d").mkdir(exist_ok=True)
        (root / "etc/tmpfiles.d/standin-gpu.conf").write_text(
            "d /run/standin-gpu 1777 root root -\n"
            f"f /run/standin-gpu/gpus.json 0644 root root - {json.dumps(DEFAULT_GPUS)}\n"
        )
        # systemd runs every generator at boot and again at each daemon-reload (the product reloads
        # for each unit it installs, the reset after a test too): the machine's 13 cost ~0.35 s a
        # reload and give a test host nothing (an empty fstab, gettys masked, no SysV scripts,
        # cryptsetup or GPT auto-mounts in a container). A link to /dev/null turns one off.
        generators = root / "etc/systemd/system-generators"
        generators.mkdir(parents=True, exist_ok=True)
        for gen in {p.name for d in GENERATOR_DIRS for p in Path(d).glob("*")}:
            (generators / gen).unlink(missing_ok=True)
            (generators / gen).symlink_to("/dev/null")
        if STANDIN_NVSMI.exists():
            target = root / "usr/local/bin/nvidia-smi"
            shutil.copy(STANDIN_NVSMI, target)
            os.chmod(target, 0o755)
        self._mask_units()

    def _mask_units(self) -> None:
        out = _sh(
            ["systemctl", f"--root={self.root}", "list-unit-files", "--state=enabled", "--no-legend", "--no-pager"]
        )
        enabled = [line.split()[0] for line in out.splitlines() if line.strip()]
        masks = [u for u in enabled if u not in KEEP_ENABLED and not u.endswith(".target")]
        _sh(["systemctl", f"--root={self.root}", "mask", *masks, *EXTRA_MASKS])
        # sshd is the host's front door whatever the machine itself does (setup.sh disables it there).
        _sh(["systemctl", f"--root={self.root}", "enable", "ssh.service"])

    def start(self) -> None:
        """Start systemd-nspawn in its own session (Ctrl-C in the terminal must not reach it)."""
        argv = [
            "systemd-nspawn",
            "--register=no",
            "--keep-unit",
            "--quiet",
            "--console=passive",
            "-D",
            str(self.root),
            "-M",
            self.machine,
            "--boot",
        ]
        if self.netns:
            argv.append(f"--network-namespace-path={self.netns}")
        argv += [f"--bind-ro={p}" for p in self.binds_ro] + [f"--bind={p}" for p in self.binds_rw]
        argv += ["--", "systemd.firstboot=off"]
        argv = ["sh", "-c", _OWN_CGROUPS + ' exec "$@"', "own-cgroups", self.cgroup, *argv]
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child, closed below
        try:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        self.nspawn_pid = self._proc.pid

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until sshd answers and systemd reports the boot finished (running or degraded)."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while not _port_open(self.address, self.port):
            if self._proc is not None and self._proc.poll() is not None:
                raise HostError(
                    f"{self.name}: systemd-nspawn exited {self._proc.returncode} during boot:\n{self.console_tail()}"
                )
            if time.monotonic() > deadline:
                raise HostError(
                    f"{self.name}: sshd on {self.address}:{self.port} not up after "
                    f"{timeout:.0f} s:\n{self.console_tail()}"
                )
            time.sleep(0.05)
        state = self.run(
            "systemctl is-system-running --wait", check=False, timeout=max(deadline - time.monotonic(), 5)
        ).stdout.strip()
        if state not in ("running", "degraded"):
            raise HostError(f"{self.name}: boot ended in state {state!r}:\n{self.console_tail()}")
        if state == "degraded":
            # A unit the tests do not need failed at boot: note it, and start from a clean slate.
            failed = self.run("systemctl --failed --no-legend --plain; systemctl reset-failed").stdout
            warnings.warn(f"{self.name}: boot degraded, failed units reset: {failed.strip()}", stacklevel=2)
        self.run(
            "mkdir -p /run/testhost && ls -1 /etc/systemd/system > /run/testhost/baseline-units && "
            "systemctl list-units --type=service,socket,timer,path,scope --plain --no-legend "
            "--state=active,activating,deactivating,reloading,failed | awk '{print $1}' | sort "
            "> /run/testhost/baseline-active"
        )
        self.boot_seconds = time.monotonic() - t0

    def console_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no console log)"
        return "\n".join(text.splitlines()[-lines:])

    @property
    def cgroup(self) -> str:
        return f"testhost-{self.machine}"

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the container (SIGTERM = orderly halt), then unmount; safe to call twice."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.close_shared_connection()
        if self.nspawn_pid:
            stop_nspawn(self.nspawn_pid, self._proc, timeout)
            self.nspawn_pid = 0
        unmount_tree(self.state_dir)
        remove_cgroups(self.cgroup)


# This machine mounts cgroup v1 hierarchies plus systemd's hybrid `unified` one, and nspawn with
# --keep-unit stays in the caller's groups: every host's systemd would build /system.slice/<unit>
# in the same place, so one unit name on two hosts collides (kill fails with EIO, start with
# 219/CGROUP). Moving the shell that execs nspawn into a group of its own in EVERY hierarchy first
# gives each host its own tree (shared/notes/testbed.md). cpuset refuses tasks until its group has
# cpus and mems, copied from the parent.
_OWN_CGROUPS = r"""
for h in /sys/fs/cgroup/*/; do
  [ -w "${h}cgroup.procs" ] || continue
  g="${h}$1"; mkdir -p "$g" 2>/dev/null || continue
  for f in cpuset.cpus cpuset.mems; do
    [ -e "$g/$f" ] && [ -z "$(cat "$g/$f")" ] && cat "${h}$f" > "$g/$f" 2>/dev/null
  done
  echo $$ > "$g/cgroup.procs" 2>/dev/null || true
done
shift
"""


def remove_cgroups(name: str) -> None:
    """Remove a stopped host's groups, deepest first (its systemd left slices inside them)."""
    for hierarchy in Path("/sys/fs/cgroup").glob("*/"):
        top = hierarchy / name
        if not top.is_dir():
            continue
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


_RESET_SCRIPT = r"""
set -u
running() { systemctl list-units --type=service,socket,timer,path,scope --plain --no-legend \
              --state=active,activating,deactivating,reloading,failed | awk '{print $1}' | sort; }
cd /etc/systemd/system
new=$(ls -1 | grep -vxF -f /run/testhost/baseline-units || true)
# Every unit running now that did not run after boot: test units, transient ones (systemd-run),
# and units whose file a test already removed.
extra=$(running | grep -vxF -f /run/testhost/baseline-active || true)
units=$(printf '%s\n' $new $extra | grep -E '\.(service|socket|timer|path|mount|target|scope)$' | sort -u || true)
if [ -n "$units" ]; then
  # --no-reload: disable would reload systemd itself (~0.6 s); the one reload below covers it.
  systemctl disable --no-reload -- $units >/dev/null 2>&1 || true
  systemctl kill --signal=SIGKILL -- $units >/dev/null 2>&1 || true
  systemctl stop -- $units >/dev/null 2>&1 || true
fi
for f in $new; do rm -rf -- "/etc/systemd/system/$f"; done
if [ -n "$new$units" ]; then systemctl daemon-reload; fi
systemctl reset-failed
mkdir -p -m 1777 /run/standin-gpu
find /run/standin-gpu -maxdepth 1 -name '*.json' ! -name gpus.json -delete
printf '%s' @GPUS@ > /run/standin-gpu/gpus.json
"""


def _sh(argv: list[str]) -> str:
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise HostError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_nspawn(pid: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM makes nspawn halt the container in order; SIGKILL if it does not within timeout."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc is not None:
                if proc.poll() is not None:
                    return
            elif not _alive(pid):
                return
            time.sleep(0.05)
    if proc is not None:
        proc.wait(timeout=10)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below path, deepest first."""
    prefix = str(path).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix + "/"):
                found.append(mp)
    return sorted(set(found), key=len, reverse=True)


def unmount_tree(path: Path) -> None:
    """Unmount everything under path (overlay before its tmpfs); lazy only as the last resort."""
    for _ in range(50):
        points = mounts_under(path)
        if not points:
            return
        for mp in points:
            if subprocess.run(["umount", mp], check=False, capture_output=True).returncode != 0:
                time.sleep(0.1)
    for mp in mounts_under(path):
        subprocess.run(["umount", "-l", mp], check=False, capture_output=True)
    if mounts_under(path):
        raise HostError(f"could not unmount {mounts_under(path)}")
