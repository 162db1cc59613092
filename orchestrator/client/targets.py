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

import os
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from orchestrator import userfiles
from orchestrator.errors import ConfigError, UsageError

DEFAULT_PYTHON = "/opt/orchestrator/venv/bin/python"
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
        return f"{self.user}@{self.address}:{self.port}"

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


def parse_url(url: str, *, name: str | None = None, source: str = "--host") -> Target:
    """ssh://[user@]address[:port] -> Target; anything else is a UsageError naming the value."""
    parts = urlsplit(url)
    try:
        port = parts.port or 22
    except ValueError as exc:
        raise UsageError(f"{source} {url!r}: bad port ({exc})") from None
    if parts.scheme != "ssh" or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise UsageError(f"{source} {url!r}: expected ssh://[user@]host[:port] or a name from {hosts_file()}")
    return Target(name=name or url, address=parts.hostname, port=port, user=unquote(parts.username or "root"))


def load_hosts(path: Path) -> dict[str, Target]:
    try:
        data = tomllib.loads(userfiles.read_bytes(path).decode())
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", file=str(path)) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(path)) from exc
    out: dict[str, Target] = {}
    for alias, entry in data.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"expected a table [{alias}] with url = \"ssh://...\"", file=str(path), key=alias)
        unknown = set(entry) - _KEYS
        if unknown:
            raise ConfigError(f"unknown key {min(unknown)!r} (known: {', '.join(sorted(_KEYS))})",
                              file=str(path), key=alias)
        bad = [k for k, v in entry.items() if not isinstance(v, str) or not v]
        if bad or "url" not in entry:
            key = f"{alias}.{bad[0] if bad else 'url'}"
            raise ConfigError("must be a non-empty string" if bad else "missing", file=str(path), key=key)
        try:
            base = parse_url(entry["url"], name=alias, source=f"{path}: {alias}.url")
        except UsageError as exc:
            raise ConfigError(str(exc)) from None
        out[alias] = Target(name=alias, address=base.address, port=base.port, user=base.user,
                            key=_expand(entry.get("key")), known_hosts=_expand(entry.get("known_hosts")),
                            python=entry.get("python", DEFAULT_PYTHON), socket=entry.get("socket"))
    return out


def resolve(spec: str) -> Target:
    """An ssh:// URL, or a name from the hosts file (which may also refine a URL's settings)."""
    path = hosts_file()
    if "://" in spec:
        known = {t.address: t for t in load_hosts(path).values()}
        url = parse_url(spec)
        ref = known.get(url.address)
        if ref is not None and (ref.port, ref.user) == (url.port, url.user):
            return Target(name=spec, address=url.address, port=url.port, user=url.user, key=ref.key,
                          known_hosts=ref.known_hosts, python=ref.python, socket=ref.socket)
        return url
    hosts = load_hosts(path)
    if spec not in hosts:
        known_names = ", ".join(sorted(hosts)) or "none"
        raise UsageError(f"unknown host {spec!r}: not an ssh:// URL and not a name in {path} (known: {known_names})")
    return hosts[spec]


def _expand(value: str | None) -> str | None:
    return os.path.expanduser(value) if value else None
