"""Where a remote CLI goes: ``--host ssh://user@box[:port]``, ``$ORCHESTRATOR_HOST``, or a named host.

Named hosts live in a small client-side file ($ORCHESTRATOR_HOSTS_FILE, else
~/.config/orchestrator/hosts.toml):

    [gpu1]
    url = "ssh://root@10.0.0.5:22"
    key = "~/.ssh/id_ed25519"                 # optional; else the SSH agent's and ~/.ssh's keys
    known_hosts = "~/.ssh/known_hosts"        # host keys are checked against it, never added
    python = "/opt/orchestrator/venv/bin/python"   # the box's interpreter with orchestrator installed
    socket = "/var/lib/orchestrator/agent.sock"    # optional; else the box's deploy.toml says
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import userfiles
from orchestrator.core.documents import clip, toml_document
from orchestrator.core.records import host_port
from orchestrator.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from orchestrator.core.catalog import Host

DEFAULT_PYTHON = "/opt/orchestrator/venv/bin/python"  # core.catalog_hosts.INSTALLED_PYTHON (no pydantic here)
_KEYS = {"url", "key", "known_hosts", "python", "socket"}


@dataclass(frozen=True)
class Target:
    """One box reached over SSH, and how to start the relay to its agent there."""

    name: str  # what the user typed (alias or URL), for messages
    address: str
    port: int = 22
    user: str = "root"
    key: str | None = None
    known_hosts: str | None = None
    python: str = DEFAULT_PYTHON
    socket: str | None = None

    @property
    def where(self) -> str:
        return f"{self.user}@{host_port(self.address, self.port)}"

    @classmethod
    def of_host(cls, host: Host) -> Target:
        """A deploy.toml host as a target (the fleet's boxes, the agentless lock): its SSH settings."""
        return cls(
            name=host.name,
            address=host.address,
            port=host.ssh_port,
            user=host.ssh_user,
            key=host.ssh_key,
            known_hosts=host.known_hosts,
            python=host.python or DEFAULT_PYTHON,
            socket=host.agent_socket,
        )

    def relay_command(self) -> str:
        argv = [self.python, "-m", "orchestrator.agent.relay"]
        if self.socket:
            argv += ["--socket", self.socket]
        return shlex.join(argv)


def hosts_file() -> Path:
    env = os.environ.get("ORCHESTRATOR_HOSTS_FILE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "orchestrator" / "hosts.toml"


# ssh://[user@]host[:port][/]: the parts split on their delimiters only; each is checked on its own
# below, so that a bad one is named instead of defaulted (an empty user is not root, :0 is not 22).
_URL_RE = re.compile(r"ssh://(?:(?P<user>[^@/]*)@)?(?P<host>\[[^\]/]*\]|[^:/@\[\]]*)(?::(?P<port>[^/]*))?/?", re.ASCII)
_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}", re.ASCII)  # what useradd takes; never an ssh option
# RFC 6874 writes the zone %25eth0 in a URL; ssh and ip write %eth0: both are taken. A Linux interface
# name is at most 15 bytes (IFNAMSIZ), never '/' or white space; this keeps it to what an operator uses.
_ZONE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
_PATH_RE = re.compile(r"/[A-Za-z0-9._+/-]+", re.ASCII)
_LABEL_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?", re.ASCII)


def parse_url(url: str, *, name: str | None = None, source: str = "--host") -> Target:
    """ssh://[user@]address[:port] -> Target; anything else is a UsageError naming the value and the
    part of it that is wrong."""

    def bad(problem: str) -> UsageError:
        return UsageError(f"{source} {clip(url)}: {problem}")

    if not url.startswith("ssh://"):
        raise bad(f"expected ssh://[user@]host[:port] or a name from {hosts_file()}")
    m = _URL_RE.fullmatch(url)
    if m is None:
        rest = url.removeprefix("ssh://")
        if "[" in rest and "]" not in rest:
            raise bad("an IPv6 address opened with '[' has no closing ']'")
        raise bad(f"{clip(rest)} is not [user@]host[:port]")
    user, host, port = m.group("user"), m.group("host"), m.group("port")
    if user is not None and not user:
        raise bad("empty user before '@' (leave 'user@' out to log in as root)")
    if user is not None and not _USER_RE.fullmatch(user):
        raise bad(f"user {clip(user)} is not a user name (letters, digits, '.', '_', '-'; at most 32)")
    return Target(name=name or url, address=_address(host, bad), port=_port(port, bad), user=user or "root")


def _address(host: str, bad: Callable[[str], UsageError]) -> str:
    if not host:
        raise bad("no host")
    if host.startswith("["):
        address, pct, zone = host[1:-1].partition("%")
        if pct:  # a zone: the interface of this machine a link-local address is reached through
            zone = zone.removeprefix("25")  # RFC 6874: the % itself as %25
            if not zone:
                raise bad(f"empty zone after '%' in [{clip(address)}%] (name the interface: [{address}%eth0])")
            if len(zone) > 15 or not _ZONE_RE.fullmatch(zone):
                raise bad(f"zone {clip(zone)} is not an interface name (letters, digits, '.', '_', '-'; at most 15)")
        try:
            ip = ipaddress.IPv6Address(address)
        except ValueError:
            raise bad(f"{clip(address)} in brackets is not an IPv6 address") from None
        if pct and not ip.is_link_local:  # getaddrinfo takes an interface name only for these
            raise bad(f"zone %{zone} on {ip}: a zone is for a link-local address (fe80::/10) only; drop it")
        return str(ip) + (f"%{zone}" if pct else "")
    for label in host.split("."):
        if len(label) > 63:
            raise bad(f"host name {clip(host)} has a label of {len(label)} characters (at most 63)")
        if not _LABEL_RE.fullmatch(label):
            raise bad(
                f"host {clip(host)} is not a host name or address (labels of letters, digits and '-', joined by '.')"
            )
    if len(host) > 253:
        raise bad(f"host name of {len(host)} characters (at most 253)")
    return host


def _port(text: str | None, bad: Callable[[str], UsageError]) -> int:
    if text is None:
        return 22
    if not text:
        raise bad("empty port after ':' (leave ':' out for 22)")
    if not re.fullmatch(r"[0-9]{1,5}", text, re.ASCII):
        raise bad(f"port {clip(text)} is not a number of ASCII digits")
    if not 1 <= int(text) <= 65535:
        raise bad(f"port {int(text)} is out of range 1-65535")
    return int(text)


def load_hosts(path: Path) -> dict[str, Target]:
    try:
        raw = userfiles.read_bytes(path)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(path)) from exc
    data = toml_document(raw, str(path))
    out: dict[str, Target] = {}
    for alias, entry in data.items():
        if not isinstance(entry, dict):
            raise ConfigError(f'expected a table [{alias}] with url = "ssh://..."', file=str(path), key=alias)
        unknown = set(entry) - _KEYS
        if unknown:
            raise ConfigError(
                f"unknown key {min(unknown)!r} (known: {', '.join(sorted(_KEYS))})", file=str(path), key=alias
            )
        bad = [k for k, v in entry.items() if not isinstance(v, str) or not v]
        if bad or "url" not in entry:
            key = f"{alias}.{bad[0] if bad else 'url'}"
            raise ConfigError("must be a non-empty string" if bad else "missing", file=str(path), key=key)
        try:
            base = parse_url(entry["url"], name=alias, source=f"{path}: {alias}.url")
        except UsageError as exc:
            raise ConfigError(str(exc)) from None
        for key in ("python", "socket"):  # words of the relay's command line on the box: plain paths only
            value = entry.get(key)
            if value is not None and not _plain_path(value):
                raise ConfigError(
                    f"{key} {clip(value)} must be an absolute path of letters, digits and . _ + - / "
                    "with no '.' or '..' parts (it is run on the box as part of the relay's command)",
                    file=str(path),
                    key=f"{alias}.{key}",
                )
        for key in ("key", "known_hosts"):  # as deploy.toml's ssh_key: never relative to wherever the CLI runs
            value = entry.get(key)
            if value is not None and (not value.startswith(("/", "~/")) or not value.isprintable()):
                raise ConfigError(
                    f"{key} {clip(value)} must be an absolute path (or start with '~/'), one line of "
                    "printable characters",
                    file=str(path),
                    key=f"{alias}.{key}",
                )
        out[alias] = Target(
            name=alias,
            address=base.address,
            port=base.port,
            user=base.user,
            key=_expand(entry.get("key")),
            known_hosts=_expand(entry.get("known_hosts")),
            python=entry.get("python", DEFAULT_PYTHON),
            socket=entry.get("socket"),
        )
    return out


def resolve(spec: str, source: str = "--host") -> Target:
    """An ssh:// URL, or a name from the hosts file (which may also refine a URL's settings); ``source``
    says where ``spec`` came from, for messages."""
    path = hosts_file()
    if "://" in spec:
        known = {t.address: t for t in load_hosts(path).values()}
        url = parse_url(spec, source=source)
        ref = known.get(url.address)
        if ref is not None and (ref.port, ref.user) == (url.port, url.user):
            return Target(
                name=spec,
                address=url.address,
                port=url.port,
                user=url.user,
                key=ref.key,
                known_hosts=ref.known_hosts,
                python=ref.python,
                socket=ref.socket,
            )
        return url
    hosts = load_hosts(path)
    if spec not in hosts:
        known_names = ", ".join(sorted(hosts)) or "none"
        where = "" if source == "--host" else f"{source}: "
        raise UsageError(
            f"{where}unknown host {clip(spec)}: not an ssh:// URL and not a name in {path} (known: {known_names})"
        )
    return hosts[spec]


def _plain_path(value: str) -> bool:
    return bool(_PATH_RE.fullmatch(value)) and not {".", ".."} & set(value.split("/")) and "//" not in value


def _expand(value: str | None) -> str | None:
    return os.path.expanduser(value) if value else None
