"""Field-level rules of deploy.toml, pure: the patterns names and paths must match, the checks a
value passes before it may reach a unit file (secrets, unsafe text, paths a unit cannot see)."""

from __future__ import annotations

import ipaddress
import posixpath
import re
from datetime import UTC, datetime, time
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.safety import check_safe_text, shown
from orchestrator.engines import ENGINE
from orchestrator.errors import RenderError
from orchestrator.secrets import secret_in_args

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# An account to log in as over SSH (what useradd takes): never an ssh option, a second word or an '@'
# (client/targets.py holds a --host URL's user to the same rule without loading pydantic).
LOGIN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,31}$", re.ASCII)
IFNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,14}", re.ASCII)
# sun_path holds 108 bytes with its NUL: a longer socket path cannot be bound or connected to.
SOCKET_PATH_MAX = 107
PATH_RE = re.compile(r"^/[^\s\"'\\]*$")
# A Hugging Face repo id: [owner/]name, letters, digits, "-", "_", "."; no "--" or ".." (the hub's
# own rules; "--" also keeps <owner>--<name> directories unambiguous).
REPO_RE = re.compile(
    r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
    r"(/[A-Za-z0-9]([A-Za-z0-9._-]{0,94}[A-Za-z0-9])?)?$"
)
# Characters git refuses in a ref name (git-check-ref-format), plus anything a shell or path reads.
_REF_BAD_RE = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
# Engine units run with PrivateTmp=yes (the shipped templates): their /tmp and /var/tmp are private and empty.
PRIVATE_TMP = ("/tmp", "/var/tmp")
# A served name the front proxy can match and list: HAProxy's `-m str` takes space-separated words
# inside a config line, and the name is written into JSON bodies, so no spaces, quotes or escapes.
ROUTABLE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")

# A DNS host name (RFC 1123 labels). Addresses reach HAProxy's config, the engine's bind flag and SSH as one
# word: nothing but an IP literal or such a name may pass, so no value can carry a second directive.
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)

# Without sleep_ram_gib, sleepers may use the host's memory minus this reserve: the OS, the agent,
# each engine's own API server and EngineCore processes (several GiB each), the page cache that
# weight loading reads through. 10% of the box, at least 16 GiB.
RAM_RESERVE_FRACTION = 0.10
RAM_RESERVE_MIN_GIB = 16.0

Name = Annotated[str, Field(pattern=NAME_RE.pattern)]
DAY = 86_400.0


class Strict(BaseModel):
    # inf and nan parse as TOML floats; no setting means anything with them.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# A served name systemd and HAProxy both take, proxy or not: one word of routable characters. Long
# values would also make a unit line systemd cannot parse (LONG_LINE_MAX); every other value that
# reaches a unit is bounded by MAX_UNIT_VALUE.
SERVED_NAME_ADVICE = (
    "use letters, digits and . _ : / @ + - (no spaces or quotes), starting with a letter or digit, at most 128"
)
MAX_UNIT_VALUE = 4096
MAX_UNIT_LINE = 65_536


def ram_reserve_gib(memory_gib: float) -> float:
    """Host RAM (GiB) kept out of the sleepers' budget on a box of ``memory_gib``."""
    return max(RAM_RESERVE_MIN_GIB, RAM_RESERVE_FRACTION * memory_gib)


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP literal or a host name) is reachable only from the box itself."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def absolute_path(value: str, what: str) -> str:
    """A directory or executable the agent and systemd use: absolute, as relative would depend on the
    working directory of whichever process reads it (the agent's is /, the CLI's is anywhere)."""
    if not value.startswith("/"):
        raise ValueError(f"{what} {shown(value)} is not an absolute path (start it with '/')")
    if {".", ".."} & set(value.split("/")):  # root writes and runs under these: say the real path
        raise ValueError(f"{what} {shown(value)} has a '.' or '..' part: name the real path")
    return value


def socket_fits(path: str, what: str) -> str:
    """A Unix socket path short enough to bind (the kernel's sun_path), named when it is not."""
    size = len(path.encode())
    if size > SOCKET_PATH_MAX:
        raise ValueError(
            f"{what} {shown(path[:60] + '...')} is {size} bytes long: a Unix socket path holds at most "
            f"{SOCKET_PATH_MAX} (sun_path), so nothing could listen there; choose a shorter one"
        )
    return path


# A socket path the agent binds as root or a relay connects to: one word of plain characters (it reaches
# HAProxy's config, a unit and an SSH command line), never traversing.
_SOCKET_RE = re.compile(r"/[A-Za-z0-9._/-]+")


def socket_file(value: str, what: str, *, suffix: bool = True) -> str:
    """An absolute socket path of letters, digits and . _ - / with no '.' or '..' parts (``/tmp/../etc/x.sock``
    is refused, not resolved), ending in '.sock' when ``suffix``, that fits sun_path."""
    name = value.rsplit("/", 1)[-1]
    if (
        not _SOCKET_RE.fullmatch(value)
        or "//" in value
        or any(p in (".", "..") for p in value.split("/"))
        or name in ("", ".sock")
        or (suffix and not name.endswith(".sock"))
    ):
        ending = " '.sock'" if suffix else ""
        raise ValueError(
            f"{what} {shown(value)} must be an absolute{ending} path of letters, digits and . _ - / "
            "with no '.' or '..' parts (the agent's sockets are bound and reached as root)"
        )
    return socket_fits(value, what)


def key_file(value: str, what: str) -> str:
    """A file the SSH client reads (a key, a known_hosts): absolute or under '~/', as a relative one
    would depend on the working directory of whichever process reads it."""
    if not value.startswith(("/", "~/")):
        raise ValueError(f"{what} {shown(value)} is not an absolute path (start it with '/' or '~/')")
    return safe(value, what)


def not_root(user: str) -> str:
    """Engines run as an unprivileged account: a model server as root owns the box."""
    if user == "root":
        raise ValueError(
            f"'root' is refused: engines run as an unprivileged account (the shipped {ENGINE.default_user!r}); "
            "set allow_root = true in [defaults] only on a disposable test bed"
        )
    return user


SECRET_ADVICE = (
    "unit files are world-readable, so secrets go in the model's EnvironmentFile "
    "(<env_dir>/<model>.env, mode 0600), never in deploy.toml"
)


class SubKeyError(ValueError):
    """An error below the field pydantic reports (``[1]`` of args, ``.HF_TOKEN`` of env)."""

    def __init__(self, sub: str, message: str) -> None:
        super().__init__(message)
        self.sub = sub


def no_secret_in(args: tuple[str, ...]) -> None:
    # Before any other check of the same values: those quote the value in their message.
    hit = secret_in_args(args)
    if hit:
        raise SubKeyError(f"[{hit[0]}]", f"holds {hit[1]} (value not shown): {SECRET_ADVICE}")


def safe(value: str, what: str) -> str:
    if len(value) > MAX_UNIT_VALUE:
        raise ValueError(
            f"{what} of {len(value):,} characters is longer than {MAX_UNIT_VALUE} (starts {shown(value[:40])})"
        )
    try:
        check_safe_text(value, what)
    except RenderError as exc:  # a ValueError, so pydantic reports it with its key path
        raise ValueError(str(exc)) from None
    return value


def check_address(value: str, what: str) -> str:
    """An IPv4/IPv6 literal (no brackets, no zone) or a DNS host name; anything else is refused."""
    if "%" not in value:
        try:
            ipaddress.ip_address(value)
            return value
        except ValueError:
            pass
        if _HOSTNAME_RE.fullmatch(value) and not re.fullmatch(r"[0-9.]+", value):
            return value
    raise ValueError(
        f"{what} {shown(value)} is not an IP address or a host name (letters, digits, '-' and "
        f"'.'; IPv6 without brackets or zone)"
    )


def under(path: str, root: str, suffix: str, what: str) -> str:
    """An absolute path inside ``root`` with no '..' or '.' parts that ends in ``suffix``: where root
    writes for the proxy stays in the product's own directories."""
    parts = path.split("/")
    if (
        not path.startswith(root)
        or path == root
        or any(p in ("..", ".") for p in parts)
        or "//" in path
        or not path.endswith(suffix)
        or path.endswith("/" + suffix)
    ):
        raise ValueError(
            f"{what} {shown(path)} must be a '{suffix}' file inside {root} (no '..' or '.' parts): "
            "the agent writes it as root"
        )
    return path


def check_revision(value: str) -> str:
    """A commit SHA, a branch or a tag name by git's ref rules: never a path or an option."""
    problem = None
    if not value or len(value) > 255:
        problem = "must be 1 to 255 characters"
    elif value.startswith("-"):
        problem = "must not start with '-'"
    elif _REF_BAD_RE.search(value):
        problem = "contains a character git does not allow in a ref (space, ~ ^ : ? * [ \\ or a control character)"
    elif ".." in value or "@{" in value or "//" in value or value == "@":
        problem = "contains '..', '@{' or '//' (a revision is a commit SHA, branch or tag, never a path)"
    elif value.startswith("/") or value.endswith(("/", ".", ".lock")):
        problem = "must not start with '/' or end with '/', '.' or '.lock'"
    elif any(part.startswith(".") for part in value.split("/")):
        problem = "has a part starting with '.' (a revision is a commit SHA, branch or tag, never a path)"
    if problem:
        raise ValueError(f"revision {shown(value)} {problem}")
    return value


def outside_private_tmp(path: str, what: str) -> None:
    norm = posixpath.normpath(path)
    for tmp in PRIVATE_TMP:
        if norm == tmp or norm.startswith(tmp + "/"):
            raise ValueError(
                f"{what} {path} is under {tmp}, which the model's unit cannot see (engine units run "
                f"with PrivateTmp=yes, an empty {tmp} of their own): move it out of /tmp and /var/tmp"
            )


def check_engine(v: tuple[str, ...]) -> tuple[str, ...]:
    no_secret_in(v)
    if not v or not v[0].startswith("/"):
        raise ValueError(f"engine must start with an absolute executable path, got {shown(repr(list(v)))}")
    for arg in v:
        safe(arg, "engine argument")
        if arg.startswith("/"):
            outside_private_tmp(arg, "engine path")
    return v


# Schedules: the cron, window and zone parsers (core.schedule computes firings from what they pass).
_WINDOW_RE = re.compile(r"^([0-9]{2}):([0-9]{2})-([0-9]{2}):([0-9]{2})$", re.ASCII)  # \d would take '٠١'
# One cron field: ASCII digits, names (jan, mon) and * , - / (croniter also reads seconds and years
# as a 6th and 7th field, and Unicode digits; docs/reference/configuration.md promises the classic 5 fields).
_CRON_FIELD_RE = re.compile(r"^[0-9A-Za-z*,/-]+$", re.ASCII)
# A cron that never fires from here on (Feb 31) is refused as well as a malformed one.
_REFERENCE = datetime(2000, 1, 1, tzinfo=UTC)


def parse_zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; ValueError naming it when unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"unknown time zone {name!r} (use an IANA name such as 'UTC' or 'Europe/Berlin')") from exc


def check_fields(expr: str) -> None:
    """Exactly 5 fields of ASCII cron characters; ValueError naming the expression otherwise."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(
            f"{expr[:80]!r} is not a valid cron expression: it has {len(fields)} fields, a cron "
            "expression has exactly 5: minute hour day month weekday (e.g. '0 3 * * *')"
        )
    bad = next((f for f in fields if not _CRON_FIELD_RE.fullmatch(f)), None)
    if bad is not None:
        raise ValueError(f"{expr!r}: field {bad!r} may hold only ASCII digits, names (jan, mon) and * , - /")


def check_cron(expr: str) -> str:
    """``expr`` when it is a cron expression that fires; ValueError naming it otherwise."""
    check_fields(expr)
    if not croniter.is_valid(expr):
        raise ValueError(f"{expr!r} is not a valid cron expression (5 fields: minute hour day month weekday)")
    try:
        croniter(expr, _REFERENCE).get_next(float)
    except CroniterError as exc:
        raise ValueError(f"cron expression {expr!r} never fires") from exc
    return expr


def parse_window(text: str) -> tuple[time, time]:
    """``"HH:MM-HH:MM"`` as (first, last); ValueError naming the text when a time is out of range."""
    m = _WINDOW_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"window {text!r} must look like 'HH:MM-HH:MM', e.g. '01:00-05:00'")
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    if h1 > 23 or h2 > 23 or m1 > 59 or m2 > 59:
        raise ValueError(f"window {text!r} has a time out of range (hours 00-23, minutes 00-59)")
    return time(h1, m1), time(h2, m2)
