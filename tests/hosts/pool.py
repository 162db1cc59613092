"""Boot and tear down sets of test hosts; slots, stale-run cleanup and exit handlers.

Each host takes a slot: a loopback address 127.0.0.<octet> (h1 -> .11 when free) guarded by a
lock file in STATE_ROOT, so concurrent test runs on one machine never share an address. A run
that died without cleaning up (SIGKILL) leaves a state file; the next run reaps it.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Self

from tests.hosts import keys
from tests.hosts import netns as netns_mod
from tests.hosts.machine import Host, HostError, remove_cgroups, repo_binds, stop_nspawn, unmount_tree

STATE_ROOT = Path(os.environ.get("TESTHOSTS_DIR", "/run/testhosts"))
FIRST_OCTET = 11  # 127.0.0.1/.2 stay free for other tools
LAST_OCTET = 250


@dataclass(eq=False)
class HostSet:
    """Hosts booted together, sharing one client key; ``close`` tears all of them down."""

    hosts: list[Host]
    key_dir: Path
    manual: bool = False
    bridge: str | None = None  # netns=True: the bridge the hosts' namespaces hang off
    _locks: list[int] = field(default_factory=list, repr=False)
    _closed: bool = False

    @property
    def key_path(self) -> Path:
        return self.key_dir / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.key_dir / "known_hosts"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        errors = []
        with ThreadPoolExecutor(max_workers=max(len(self.hosts), 1)) as pool:
            for host, fut in [(h, pool.submit(_teardown, h)) for h in self.hosts]:
                exc = fut.exception()
                if exc is not None:
                    errors.append(f"{host.name}: {exc}")
        if self.bridge:
            netns_mod.delete_link(self.bridge)
        for fd in self._locks:
            os.close(fd)
        if not self.manual:
            shutil.rmtree(self.key_dir, ignore_errors=True)
        _LIVE.discard(self)
        if errors:
            raise HostError("teardown failed: " + "; ".join(errors))


def _teardown(host: Host) -> None:
    host.stop()
    if host.netns:
        netns_mod.delete_namespace(Path(host.netns).name)
    shutil.rmtree(host.state_dir, ignore_errors=True)
    host.state_dir.with_suffix(".json").unlink(missing_ok=True)


def boot_hosts(
    count: int,
    *,
    binds_ro: tuple[str, ...] = (),
    binds_rw: tuple[str, ...] = (),
    manual: bool = False,
    timeout: float = 120.0,
    netns: bool = False,
) -> HostSet:
    """Boot ``count`` hosts in parallel; returns when every one has finished booting.

    netns=True puts each host in a network namespace of its own behind a bridge (tests/hosts/netns.py),
    so its traffic crosses a network; by default hosts share this machine's loopback.
    On any failure everything already started is torn down before the error propagates.
    """
    _install_exit_handlers()
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    _reap_key_dirs()
    key_dir = (
        (STATE_ROOT / "manual-keys")
        if manual
        else Path(tempfile.mkdtemp(prefix=f"keys-{os.getpid()}-", dir=STATE_ROOT))
    )
    client_pub = keys.generate_ed25519(key_dir / "id_ed25519", "testhosts-client")
    slots = _claim_slots(count, manual)
    hostset = HostSet(hosts=[], key_dir=key_dir, manual=manual, _locks=[fd for _, fd in slots])
    _LIVE.add(hostset)
    try:
        known = []
        first = slots[0][0]
        if netns:
            hostset.bridge = netns_mod.create_bridge(first)
        for i, (octet, _) in enumerate(slots, start=1):
            state_dir = STATE_ROOT / str(octet)
            address = netns_mod.address(first, octet) if netns else f"127.0.0.{octet}"
            host = Host(
                name=f"h{i}",
                address=address,
                state_dir=state_dir,
                netns=netns_mod.create_namespace(first, octet) if netns else None,
                key_path=key_dir / "id_ed25519",
                known_hosts_path=key_dir / "known_hosts",
                host_key_path=key_dir / f"host_h{i}_ed25519",
                binds_ro=(*repo_binds(), *binds_ro),
                binds_rw=binds_rw,
            )
            hostset.hosts.append(host)
            pub = keys.generate_ed25519(host.host_key_path, f"testhost-{host.name}")
            known.append(keys.known_hosts_line(host.address, host.port, pub))
        keys.write_known_hosts(key_dir / "known_hosts", known)
        with ThreadPoolExecutor(max_workers=count) as pool:
            for fut in [pool.submit(_boot_one, h, client_pub, manual, timeout) for h in hostset.hosts]:
                fut.result()
    except BaseException:
        hostset.close()
        raise
    return hostset


def _boot_one(host: Host, client_pub: str, manual: bool, timeout: float) -> None:
    _write_state(host, manual)
    host.prepare(client_pub)
    host.start()
    _write_state(host, manual)
    host.wait_ready(timeout)


def _write_state(host: Host, manual: bool) -> None:
    state = {
        "name": host.name,
        "address": host.address,
        "nspawn_pid": host.nspawn_pid,
        "owner_pid": 0 if manual else os.getpid(),
        "manual": manual,
        "state_dir": str(host.state_dir),
        "key_path": str(host.key_path),
        "known_hosts_path": str(host.known_hosts_path),
        "netns": host.netns,
    }
    path = host.state_dir.with_suffix(".json")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def _claim_slots(count: int, manual: bool) -> list[tuple[int, int]]:
    """Lock the first ``count`` free addresses; reap slots a dead run left behind."""
    claimed: list[tuple[int, int]] = []
    for octet in range(FIRST_OCTET, LAST_OCTET + 1):
        if len(claimed) == count:
            break
        fd = os.open(STATE_ROOT / f"{octet}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        state_file = STATE_ROOT / f"{octet}.json"
        if state_file.exists():
            state = json.loads(state_file.read_text() or "{}")
            if state.get("manual"):
                os.close(fd)  # hosts started by hand stay until `scripts/testhosts down`
                continue
            reap(state_file)
        if _listening(f"127.0.0.{octet}", 22):
            os.close(fd)  # something outside the harness uses this address
            continue
        claimed.append((octet, fd))
    if len(claimed) < count:
        for _, fd in claimed:
            os.close(fd)
        raise HostError(f"only {len(claimed)} of {count} loopback slots are free in {STATE_ROOT}")
    return claimed


def reap(state_file: Path) -> None:
    """Tear down what a state file describes: stop its nspawn (only if it is ours), unmount."""
    state = json.loads(state_file.read_text() or "{}")
    pid = int(state.get("nspawn_pid") or 0)
    state_dir = Path(state.get("state_dir") or state_file.with_suffix(""))
    if pid and _is_our_nspawn(pid, state_dir):
        stop_nspawn(pid, None, 30.0)
    unmount_tree(state_dir)
    remove_cgroups(f"testhost-th{state_file.stem}")
    if state.get("netns"):  # the bridge (named after the run's first slot) is dropped when that slot is reaped
        netns_mod.delete_namespace(Path(state["netns"]).name)
        netns_mod.delete_link(netns_mod.bridge_name(int(state_file.stem)))
    shutil.rmtree(state_dir, ignore_errors=True)
    state_file.unlink(missing_ok=True)


def _reap_key_dirs() -> None:
    """Key folders of test runs whose process is gone (killed before its exit handlers ran)."""
    for d in STATE_ROOT.glob("keys-*-*"):
        pid = int(d.name.split("-")[1])
        if not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


def _is_our_nspawn(pid: int, state_dir: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    return b"systemd-nspawn" in cmdline[0] and str(state_dir / "root").encode() in cmdline


def _listening(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.3):
        return True
    return False


# -- cleanup on exit, SIGTERM, SIGHUP and Ctrl-C ---------------------------------------------------

_LIVE: set[HostSet] = set()
_handlers_installed = False


def close_all() -> None:
    for hostset in list(_LIVE):
        if not hostset.manual:
            with contextlib.suppress(HostError):
                hostset.close()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # KeyboardInterrupt lets pytest run its finalizers; atexit is the backstop.
    raise KeyboardInterrupt(f"signal {signum}")


def _install_exit_handlers() -> None:
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(close_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_signal)
