"""`agent install` on a fleet's controller: its own SSH identity and known_hosts for the group's hosts.

A controller (an agent whose deploy.toml has groups) reaches every group host's agent with the
``ssh_key`` and ``known_hosts`` its deploy.toml names for that host, never with an operator's key.
The installer makes those real on the controller box: the key is generated there when missing (the
private half never leaves the box), and with ``--authorize`` the installer (from the machine it runs
on, with the operator's key) appends the public key to each group host's authorized_keys and writes
the host key that its own checked connection saw into the controller's known_hosts. A group host it
cannot reach is named with the line to authorize there by hand; its host key is then scanned from the
controller box (ssh-keyscan: trust on first use, said so in the step).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.adapters.ssh import SshShell
from orchestrator.core.catalog import Catalog, Host
from orchestrator.errors import OrchestratorError, UsageError

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"  # of the agent's user (root) when a host names none

Step = Callable[[str, bool, str], None]  # (name, changed, detail)


@dataclass(frozen=True)
class Reach:
    """How the installer reaches group hosts itself (--authorize): the operator's key and known_hosts."""

    key: str | None
    known_hosts: str | None


def group_hosts(catalog: Catalog) -> list[Host]:
    """The hosts the controller reaches over SSH (every group host not on the box itself), each with the
    ssh_key it needs; UsageError naming the first host without one, before anything is changed."""
    names = sorted({h for g in catalog.groups.values() for h in g.hosts})
    hosts = [catalog.hosts[n] for n in names if catalog.hosts[n].transport == "ssh"]
    for h in hosts:
        if h.ssh_key is None:
            group = next(g.name for g in catalog.groups.values() if h.name in g.hosts)
            raise UsageError(
                f"host {h.name} of group {group} has no ssh_key: the controller reaches it with its "
                f'own key, never an operator\'s; set ssh_key = "/etc/orchestrator/controller_ed25519" '
                "(agent install generates it on the controller) in its [hosts] table"
            )
    return hosts


# On a group host, as its login user: the file sshd really reads for that user (`sshd -T`, which needs
# root; else sshd's default), the key ($1) appended once. Prints "added" when it was not there.
_AUTHORIZE = r"""
f=$(sshd -T 2>/dev/null | awk '$1 == "authorizedkeysfile" {print $2; exit}')
f=${f:-.ssh/authorized_keys}
f=$(printf '%s' "$f" | sed "s|%h|$HOME|g; s|%u|$(id -un)|g; s|%%|%|g")
case "$f" in /*) ;; *) f="$HOME/$f" ;; esac
umask 077
mkdir -p "$(dirname "$f")" && touch "$f"
grep -qxF "$1" "$f" || { printf '%s\n' "$1" >> "$f" && echo added; }
echo "file=$f"
"""


def known_hosts_pattern(h: Host) -> str:
    return h.address if h.ssh_port == 22 else f"[{h.address}]:{h.ssh_port}"


class ControllerKeys:
    """The steps on the controller box (``box``: the installer's SSH connection to it)."""

    def __init__(self, box: SshShell, step: Step, say: Callable[[str], None]) -> None:
        self.box, self.step, self.say = box, step, say

    def _run(self, script: str, timeout: float = 60.0) -> str:
        return self.box.run(["sh", "-c", script], timeout=timeout).stdout

    def setup(self, catalog: Catalog, reach: Reach | None) -> dict[str, str]:
        """Keys, authorization, known_hosts; returns each key's public line (to print)."""
        hosts = group_hosts(catalog)
        publics: dict[str, str] = {}
        for path in sorted({str(h.ssh_key) for h in hosts}):
            publics[path] = self._key(path)
        seen: dict[str, str] = {}  # host name -> "type base64" as the installer's checked connection saw it
        for h in hosts:
            public = publics[str(h.ssh_key)]
            if reach is None:
                self.step(
                    f"authorize {h.name}",
                    False,
                    f"not reached (no --authorize): add to "
                    f"the authorized_keys of {h.ssh_user}@{known_hosts_pattern(h)} the line {public}",
                )
                continue
            try:
                seen[h.name] = self._authorize(h, public, reach)
            except OrchestratorError as exc:
                self.step(
                    f"authorize {h.name}",
                    False,
                    f"cannot reach it from here ({str(exc).splitlines()[0]}): "
                    f"add to the authorized_keys of {h.ssh_user}@{known_hosts_pattern(h)} the line {public}",
                )
        for h in hosts:
            self._known(h, seen.get(h.name))
        return publics

    def _key(self, path: str) -> str:
        q = shlex.quote(path)
        out = self._run(
            f"made=''; if ! test -f {q}; then install -d -m 0700 \"$(dirname {q})\" && "
            f"ssh-keygen -q -t ed25519 -N '' -C \"orchestrator-controller@$(hostname -s)\" -f {q} "
            f'</dev/null >/dev/null && made=yes; fi; echo "made=$made"; cat {q}.pub'
        )
        made, _, public = out.partition("\n")
        line = public.strip()
        if not line:
            raise OrchestratorError(f"host {self.box.where}: {path} has no public half {path}.pub to authorize")
        self.step(
            "controller key", made == "made=yes", f"{path} {'generated' if made == 'made=yes' else 'exists'}: {line}"
        )
        return line

    def _authorize(self, h: Host, public: str, reach: Reach) -> str:
        shell = SshShell(
            h.address,
            port=h.ssh_port,
            user=h.ssh_user,
            key_filename=reach.key,
            known_hosts=reach.known_hosts,
            host=h.name,
            default_keys=True,
        )
        try:
            shell.connect()
            out = shell.run(["sh", "-c", _AUTHORIZE, "authorize", public], timeout=30).stdout
            server = shell.server_key()
        finally:
            shell.close()
        added = "added" in out.split()
        file = next((w.removeprefix("file=") for w in out.split() if w.startswith("file=")), "authorized_keys")
        self.step(
            f"authorize {h.name}",
            added,
            f"the controller's key {'added to' if added else 'already in'} {h.ssh_user}@{h.name}:{file}",
        )
        return server

    def _known(self, h: Host, server: str | None) -> None:
        path = h.known_hosts or DEFAULT_KNOWN_HOSTS
        file = path if path != DEFAULT_KNOWN_HOSTS else '"$HOME/.ssh/known_hosts"'
        file = file if file.startswith('"') else shlex.quote(file)
        pattern = known_hosts_pattern(h)
        present = self._run(
            f"test -f {file} && ssh-keygen -F {shlex.quote(pattern)} -f {file} >/dev/null && echo yes || true"
        ).strip()
        if present == "yes":
            self.step(f"known_hosts {h.name}", False, f"{path} already holds {pattern}")
            return
        if server is not None:
            line, how = f"{pattern} {server}", "as the installer's checked connection saw it"
        else:
            scan = (
                self.box.run(
                    ["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(h.ssh_port), h.address],
                    check=False,
                    timeout=30,
                )
                .stdout.strip()
                .splitlines()
            )
            found = [s for s in scan if s and not s.startswith("#")]
            if not found:
                raise OrchestratorError(
                    f"host {self.box.where}: ssh-keyscan of {h.name} ({pattern}) found no host "
                    f"key: the controller cannot reach it; add its key to {path} by hand"
                )
            keytype, blob = found[0].split()[1:3]
            line, how = f"{pattern} {keytype} {blob}", "scanned from the controller (trust on first use)"
        self._run(f"umask 022; mkdir -p \"$(dirname {file})\" && printf '%s\\n' {shlex.quote(line)} >> {file}")
        self.step(f"known_hosts {h.name}", True, f"{pattern} added to {path}, {how}")
