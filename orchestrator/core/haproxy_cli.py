"""HAProxy's own answers about a reload, parsed (pure): which workers run, and whether an old one
can still send a request to an engine that is about to stop or sleep.

A reload (USR2 to the master) returns before the master re-executes and forks the new worker, so
"no old worker" seen right after it proves nothing. The facts used instead, from the master CLI:

* ``show proc``: the master's reload count and the PID of every worker, current and old;
  the new config serves once a worker that was not there before is listed after the count rose.
* ``@!PID show info`` / ``@!PID show stat`` of each old worker: whether it stopped listening
  (``Stopping: 1``) and its sessions per server (requests in flight to each engine);
  ``@!PID get var proc.drained_<backend>``: whether the drain marked that backend (see below).

An old worker answers one more request on every client connection it still holds (keep-alive,
``option idle-close-on-response``), and a slow client's request once its body is in, routed by its
own config. So the drain marks, in each stopping old worker, every backend with a server at a
drained engine (``set var proc.drained_<backend>``; the runtime API refuses ``set server`` in a
stopping worker): such a backend then sends what comes later through the current worker, which
routes by the current config (haproxy.cfg.j2's ``use-server current``). A connection with no
request in flight to the engine then holds no drain; only the engine's sessions do.
"""

from __future__ import annotations

import csv
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Procs:
    """``show proc`` of the master: reload counts and worker PIDs."""

    reloads: int
    failed: int
    workers: tuple[int, ...]
    old_workers: tuple[int, ...]


def parse_show_proc(text: str) -> Procs | None:
    """None when the text is not a ``show proc`` answer (the master is re-executing, or gone)."""
    reloads: int | None = None
    failed = 0
    section = ""
    workers: list[int] = []
    old: list[int] = []
    for line in text.splitlines():
        if line.startswith("#"):
            section = line.strip("# ").strip()
            continue
        fields = line.split()
        if len(fields) < 3 or not fields[0].isdigit():
            continue
        if fields[1] == "master":
            reloads = int(fields[2]) if fields[2].isdigit() else None
            if "[failed:" in line:
                failed = int(line.split("[failed:", 1)[1].split("]", 1)[0].strip() or 0)
        elif fields[1] == "worker":
            (old if section == "old workers" else workers).append(int(fields[0]))
    if reloads is None:
        return None
    return Procs(reloads=reloads, failed=failed, workers=tuple(workers), old_workers=tuple(old))


def new_worker(before: Procs | None, now: Procs | None) -> int | None:
    """The worker a reload (or a start, ``before`` None) forked, once the master lists it."""
    if now is None:
        return None
    if before is not None and now.reloads <= before.reloads:
        return None
    fresh = [pid for pid in now.workers if before is None or pid not in before.workers]
    return fresh[0] if fresh else None


@dataclass(frozen=True)
class OldWorker:
    """What an old worker says about itself; a text is empty when it did not answer."""

    pid: int
    info: str
    stat: str
    marks: str = ""  # its `get var proc.drained_<backend>` answers, one per backend

    @property
    def drained(self) -> frozenset[str]:
        """The backends the drain marked in this worker: they send new requests to the current worker."""
        return frozenset(re.findall(rf"^{re.escape(MARK)}(\w+): type=bool value=<1>", self.marks, re.MULTILINE))


MARK = "proc.drained_"  # + a backend's name: haproxy.cfg.j2 reads it in that backend's use-server rule
_BACKEND = re.compile(r"[A-Za-z0-9_]+")


def stat_rows(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("# pxname,"):
        return []
    return list(csv.DictReader([lines[0][2:], *lines[1:]]))


def _stopping(info: str) -> bool:
    return any(ln.replace(" ", "") == "Stopping:1" for ln in info.splitlines())


def _matches(addr: str, engines: Iterable[tuple[str, int]]) -> bool:
    """A server's ``addr`` (ip:port as HAProxy resolved it) against the engines' address and port;
    a name that HAProxy resolved is matched on the port alone (ports are unique on a host)."""
    host, _, port = addr.rpartition(":")
    for address, p in engines:
        if port == str(p) and (host.strip("[]") == address or not _is_ip(address)):
            return True
    return False


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _servers(worker: OldWorker, engines: list[tuple[str, int]]) -> list[dict[str, str]]:
    return [
        r
        for r in stat_rows(worker.stat)
        if r.get("svname") not in ("FRONTEND", "BACKEND") and _matches(r.get("addr", ""), engines)
    ]


def to_mark(worker: OldWorker, engines: Iterable[tuple[str, int]]) -> list[str]:
    """The backends of this stopping old worker with a server at one of ``engines`` that the drain has
    not marked yet. A worker still listening is left alone: a request it sent through the current
    worker could come back to itself."""
    if not worker.info or not _stopping(worker.info):
        return []
    names = {r["pxname"] for r in _servers(worker, list(engines))}
    return sorted(n for n in names - worker.drained if _BACKEND.fullmatch(n))


def mark_commands(workers: Mapping[int, OldWorker], engines: Iterable[tuple[str, int]]) -> list[str]:
    """Master CLI commands marking what ``to_mark`` finds in each old worker (``set var`` is an
    experimental-mode command in HAProxy 2.6; the master passes the mode on to the worker)."""
    engines = list(engines)
    return [
        f"experimental-mode on; @!{pid} set var {MARK}{name} bool(1)"
        for pid, worker in sorted(workers.items())
        for name in to_mark(worker, engines)
    ]


def may_reach(worker: OldWorker, engines: Iterable[tuple[str, int]]) -> bool:
    """Whether this old worker can still send a request to one of ``engines``: True unless it
    answered and either its config has no server there, or every backend with a server there is
    marked (it sends new requests to the current worker) and has no request in flight to them.
    A client connection without a request at the engine (idle keep-alive, a slow client still
    sending) does not count: what it sends later goes to the current worker."""
    if not stat_rows(worker.stat) or not worker.info:
        return True  # no answer: it may still be starting to stop; ask again
    servers = _servers(worker, list(engines))
    if not servers:
        return False
    in_flight = sum(int(r.get("scur") or 0) + int(r.get("qcur") or 0) for r in servers)
    return in_flight > 0 or any(r["pxname"] not in worker.drained for r in servers)


def draining(procs: Procs, workers: Mapping[int, OldWorker], engines: Iterable[tuple[str, int]]) -> int:
    """How many old workers can still reach ``engines`` (0: the engines may stop)."""
    engines = list(engines)
    return sum(1 for pid in procs.old_workers if pid not in workers or may_reach(workers[pid], engines))


@dataclass(frozen=True)
class Sessions:
    """One engine's sessions as every worker of the proxy counts them (models on demand: idleness)."""

    current: int  # scur + qcur (in flight at the engine or queued for it), summed over the workers
    idle_s: float | None  # lastsess: seconds since its last session, the least over the workers; None: never
    total: int = 0  # stot, summed over the workers (a reload's new worker starts again from 0)


def sessions(stats: Iterable[str], engines: Iterable[tuple[str, int]]) -> dict[tuple[str, int], Sessions]:
    """Each engine's Sessions from the ``show stat`` answers of the proxy's workers; an engine no
    worker has a server for is left out (the proxy does not route to it)."""
    engines = list(engines)
    out: dict[tuple[str, int], Sessions] = {}
    for text in stats:
        for row in stat_rows(text):
            if row.get("svname") in ("FRONTEND", "BACKEND"):
                continue
            for engine in engines:
                if not _matches(row.get("addr", ""), [engine]):
                    continue
                scur, stot = int(row.get("scur") or 0) + int(row.get("qcur") or 0), int(row.get("stot") or 0)
                last = int(row.get("lastsess") or -1)
                seen = out.get(engine)
                idle = None if last < 0 else float(last)
                if seen is not None:
                    scur, stot = scur + seen.current, stot + seen.total
                    idle = seen.idle_s if idle is None else idle if seen.idle_s is None else min(idle, seen.idle_s)
                out[engine] = Sessions(scur, idle, stot)
    return out


# -- withdrawing a route without a reload (models on demand: the swap's route move) ----------------
# A swap on demand takes the displaced engines out of the running worker through its runtime API
# (`set server B/S state maint`): at once, where a reload (config check, re-exec, new worker) is
# ~0.15 s inside the held request's wait. The current worker is `@1` (HAProxy 2.6: one worker).
CURRENT_STAT = "@1 show stat"  # the current worker's stats, read after runtime commands: the proof they took
WITHDRAW_STAT = CURRENT_STAT


ENGINE_SERVER = re.compile(r"engine\d*")  # haproxy.cfg.j2's engine servers: engine, engine2 ... (a name's alternates)


def engine_servers(config: str, engines: Iterable[tuple[str, int]]) -> list[tuple[str, str]]:
    """(backend, server) of each ``server engineN ADDR`` line of a rendered haproxy.cfg at one of
    ``engines`` (haproxy.cfg.j2 names a backend's engine servers ``engine``, ``engine2`` ...)."""
    engines = list(engines)
    backend = ""
    out: list[tuple[str, str]] = []
    for line in config.splitlines():
        words = line.split()
        if words[:1] == ["backend"] and len(words) > 1:
            backend = words[1]
        elif (
            words[:1] == ["server"]
            and len(words) > 2
            and ENGINE_SERVER.fullmatch(words[1])
            and backend
            and _BACKEND.fullmatch(backend)
            and _matches(words[2].strip('"'), engines)
        ):
            out.append((backend, words[1]))
    return out


def withdraw_commands(servers: Iterable[tuple[str, str]]) -> list[str]:
    """Master CLI commands that put each server of the current worker in maintenance, then read its stats."""
    return [*(f"@1 set server {b}/{s} state maint" for b, s in servers), WITHDRAW_STAT]


def withdrawn(stat: str, servers: Iterable[tuple[str, str]]) -> bool:
    """Whether the current worker's ``show stat`` lists every one of ``servers`` in maintenance."""
    status = {(r.get("pxname"), r.get("svname")): r.get("status", "") for r in stat_rows(stat)}
    return all(status.get(s, "").startswith("MAINT") for s in servers)
