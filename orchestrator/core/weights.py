"""Pure rules for staged model weights: what a request is, when a model counts as staged, how much
space a download still needs and which old revisions a cleanup may remove.

No I/O here: the stage worker lists directories and asks the hub, then hands plain mappings
(file name -> size in bytes) to these functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.errors import WeightsError

MANIFEST_NAME = ".orchestrator-manifest.json"
INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
STAGING_PREFIX = ".staging-"
PART_SUFFIX = ".part"
_SHA = re.compile(r"[0-9a-f]{40}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# What ssh and rsync may be handed as a peer: a host name or an IP literal and a login name, never
# anything that starts with "-" (it would be read as an option: -oProxyCommand=...).
_ADDRESS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:\[\]-]{0,252}")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
PROTECT_NAME = ".orchestrator-protected.json"


def is_commit_sha(revision: str) -> bool:
    return bool(_SHA.fullmatch(revision))


def fmt_bytes(n: int) -> str:
    """Human-readable size for messages (GiB/MiB/KiB, or bytes)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def check_file_name(name: str, *, repo: str, where: str) -> None:
    """A file name from a listing or a manifest must stay inside the model directory: relative,
    POSIX, no ``..``/``.``/empty part, no backslash or control character. The worker also resolves
    it against the directory on disk (symlinks)."""
    bad = (
        not name
        or name.startswith("/")
        or "\\" in name
        or any(ord(c) < 32 or c == "\x7f" for c in name)
        or any(part in ("", ".", "..") for part in name.split("/"))
    )
    if bad:
        raise WeightsError(
            f"{where}: file name {name!r} listed for {repo} is not a plain relative path "
            "inside the model directory; refusing to stage it"
        )


def check_file_names(names: Iterable[str], *, repo: str, where: str) -> None:
    for name in names:
        check_file_name(name, repo=repo, where=where)


@dataclass(frozen=True)
class PeerSpec:
    """Another host of the fleet that already holds the model, reached by rsync over SSH."""

    address: str
    root: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None
    known_hosts: str | None = None

    def __post_init__(self) -> None:
        if not _ADDRESS.fullmatch(self.address):
            raise WeightsError(f"peer address {self.address!r} is not a host name or IP address")
        if not _USER.fullmatch(self.user):
            raise WeightsError(f"peer {self.address}: ssh user {self.user!r} is not a login name")
        if (
            not self.root.startswith("/")
            or any(p in (".", "..") for p in self.root.split("/"))
            or any(ord(c) < 32 for c in self.root)
        ):
            raise WeightsError(f"peer {self.address}: weight root {self.root!r} is not a plain absolute path")
        if not 1 <= self.port <= 65535:
            raise WeightsError(f"peer {self.address}: ssh port {self.port} is out of range")


@dataclass(frozen=True)
class StageRequest:
    """What to stage where. ``source`` is "hub", "local:/dir" or "host:<label>" (with ``peer``)."""

    name: str
    repo: str
    revision: str
    root: str
    source: str = "hub"
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()
    token_file: str | None = None
    endpoint: str | None = None
    peer: PeerSpec | None = None
    reserve_bytes: int = 0
    # > 0: when space is short, old revisions that the keep-N cleanup would remove anyway may go
    # first (never those in <root>/.orchestrator-protected.json: the serving and rollback ones).
    keep_revisions: int = 0
    unit_dir: str | None = None  # a revision an installed unit there names is never removed

    def __post_init__(self) -> None:
        if not self.revision:  # no pin given: the default branch, resolved and recorded as a SHA
            object.__setattr__(self, "revision", "main")
        if not _NAME.fullmatch(self.name):
            raise WeightsError(f"model name {self.name!r} is not a plain directory name")
        if not self.root.startswith("/"):
            raise WeightsError(f"model {self.name}: weight root {self.root!r} is not an absolute path")
        kind = self.source.split(":", 1)[0]
        if kind not in ("hub", "local", "host") or (kind != "hub" and ":" not in self.source):
            raise WeightsError(f"model {self.name}: source {self.source!r} is not hub, local:/dir or host:NAME")
        if kind == "host" and self.peer is None:
            raise WeightsError(f"model {self.name}: source {self.source!r} needs peer connection details")
        if kind != "hub" and not is_commit_sha(self.revision):
            raise WeightsError(
                f"model {self.name}: source {self.source!r} needs a commit SHA revision, got {self.revision!r}"
            )

    @property
    def source_kind(self) -> str:
        return self.source.split(":", 1)[0]

    @property
    def source_arg(self) -> str:
        return self.source.split(":", 1)[1] if ":" in self.source else ""

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "repo": self.repo,
            "revision": self.revision,
            "root": self.root,
            "source": self.source,
            "allow_patterns": list(self.allow_patterns),
            "ignore_patterns": list(self.ignore_patterns),
            "token_file": self.token_file,
            "endpoint": self.endpoint,
            "reserve_bytes": self.reserve_bytes,
            "keep_revisions": self.keep_revisions,
            "unit_dir": self.unit_dir,
            "peer": None
            if self.peer is None
            else {
                "address": self.peer.address,
                "root": self.peer.root,
                "port": self.peer.port,
                "user": self.peer.user,
                "key_file": self.peer.key_file,
                "known_hosts": self.peer.known_hosts,
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> StageRequest:
        try:
            peer = data.get("peer")
            return cls(
                name=str(data["name"]),
                repo=str(data["repo"]),
                revision=str(data["revision"]),
                root=str(data["root"]),
                source=str(data.get("source", "hub")),
                allow_patterns=tuple(str(p) for p in _seq(data.get("allow_patterns"))),
                ignore_patterns=tuple(str(p) for p in _seq(data.get("ignore_patterns"))),
                token_file=_opt_str(data.get("token_file")),
                endpoint=_opt_str(data.get("endpoint")),
                reserve_bytes=int(str(data.get("reserve_bytes", 0))),
                keep_revisions=int(str(data.get("keep_revisions", 0))),
                unit_dir=_opt_str(data.get("unit_dir")),
                peer=None
                if not isinstance(peer, Mapping)
                else PeerSpec(
                    address=str(peer["address"]),
                    root=str(peer["root"]),
                    port=int(str(peer["port"])),
                    user=str(peer["user"]),
                    key_file=_opt_str(peer.get("key_file")),
                    known_hosts=_opt_str(peer.get("known_hosts")),
                ),
            )
        except (KeyError, ValueError) as exc:
            raise WeightsError(f"stage request is malformed: {exc!r}") from exc


def _seq(value: object) -> Sequence[object]:
    return value if isinstance(value, (list, tuple)) else ()


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Manifest:
    """Written next to the files, atomically, only after they were verified."""

    name: str
    repo: str
    revision: str
    files: dict[str, int]
    source: str
    staged_at: float
    path: str
    index_sha256: str | None = None
    requested_revision: str | None = None
    sha256: dict[str, str] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "repo": self.repo,
            "revision": self.revision,
            "requested_revision": self.requested_revision,
            "source": self.source,
            "staged_at": self.staged_at,
            "path": self.path,
            "index_sha256": self.index_sha256,
            "total_bytes": self.total_bytes,
            "files": dict(sorted(self.files.items())),
            "sha256": dict(sorted(self.sha256.items())),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Manifest:
        try:
            files = data["files"]
            sha = data.get("sha256") or {}
            if not isinstance(files, Mapping) or not isinstance(sha, Mapping):
                raise TypeError("files is not a mapping")
            return cls(
                name=str(data["name"]),
                repo=str(data["repo"]),
                revision=str(data["revision"]),
                files={str(k): int(v) for k, v in files.items()},
                source=str(data["source"]),
                staged_at=float(str(data["staged_at"])),
                path=str(data["path"]),
                index_sha256=_opt_str(data.get("index_sha256")),
                requested_revision=_opt_str(data.get("requested_revision")),
                sha256={str(k): str(v) for k, v in sha.items()},
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise WeightsError(f"manifest is malformed: {exc!r}") from exc


def index_shards(index: object, *, where: str) -> set[str]:
    """Shard file names named by model.safetensors.index.json's weight_map (never a guessed pattern)."""
    weight_map = index.get("weight_map") if isinstance(index, Mapping) else None
    if not isinstance(weight_map, Mapping) or not weight_map:
        raise WeightsError(f"{where}: {INDEX_NAME} has no weight_map")
    return {str(v) for v in weight_map.values()}


def listing_problems(
    expected: Mapping[str, int], present: Mapping[str, int], index: object | None, *, where: str
) -> list[str]:
    """Every reason the files in ``present`` are not the complete model ``expected`` describes."""
    problems: list[str] = []
    if CONFIG_NAME not in expected:
        problems.append(f"{where}: {CONFIG_NAME} is not in the file list")
    required = set(expected)
    if index is not None:
        for shard in sorted(index_shards(index, where=where)):
            if shard not in expected:
                problems.append(
                    f"{where}: shard {shard} named in {INDEX_NAME} is not in the file list "
                    "(missing on the source, or excluded by a pattern)"
                )
            required.add(shard)
    elif not any(f.endswith(".safetensors") for f in expected):
        problems.append(f"{where}: no {INDEX_NAME} and no *.safetensors file in the file list")
    for name in sorted(required):
        want = expected.get(name)
        got = present.get(name)
        if got is None:
            if want is not None:
                problems.append(f"{where}: {name} is missing (expected {want} bytes, found none)")
        elif want is not None and got != want:
            problems.append(f"{where}: {name} has the wrong size (expected {want} bytes, found {got})")
    return problems


def in_place_problems(present: Mapping[str, int], index: object | None, *, where: str) -> list[str]:
    """Every reason a directory used where it is (no listing but its own) is not a whole model."""
    problems: list[str] = []
    if CONFIG_NAME not in present:
        problems.append(f"{where}: {CONFIG_NAME} is missing")
    if index is not None:
        problems += [
            f"{where}: shard {shard} named in {INDEX_NAME} is missing"
            for shard in sorted(index_shards(index, where=where))
            if shard not in present
        ]
    elif not any(f.endswith(".safetensors") for f in present):
        problems.append(f"{where}: no {INDEX_NAME} and no *.safetensors file")
    return problems


def index_tensors(index: object | None) -> dict[str, set[str]]:
    """Shard file -> the tensor names the index places in it."""
    weight_map = index.get("weight_map") if isinstance(index, Mapping) else None
    out: dict[str, set[str]] = {}
    for tensor, shard in weight_map.items() if isinstance(weight_map, Mapping) else ():
        out.setdefault(str(shard), set()).add(str(tensor))
    return out


def verify_listing(
    expected: Mapping[str, int], present: Mapping[str, int], index: object | None, *, where: str
) -> None:
    """Raise WeightsError naming each missing or wrongly sized file; return when the model is whole."""
    problems = listing_problems(expected, present, index, where=where)
    if problems:
        raise WeightsError("; ".join(problems))


def space_needed(expected: Mapping[str, int], present: Mapping[str, int]) -> int:
    """Bytes still to write: complete files and resumable partial bytes count as already there."""
    need = 0
    for name, size in expected.items():
        have = present.get(name, 0)
        need += size - have if have <= size else size
    return need


def check_space(needed: int, free: int, *, where: str, reserve: int = 0, reclaimable: int = 0) -> None:
    """Enough room counting what the keep-N cleanup may free (``reclaimable``) as room."""
    if needed + reserve > free + reclaimable:
        extra = f" plus a reserve of {fmt_bytes(reserve)}" if reserve else ""
        freeable = (
            (f" and {fmt_bytes(reclaimable)} ({reclaimable} bytes) that removing old revisions would free")
            if reclaimable
            else ""
        )
        raise WeightsError(
            f"{where}: needs {fmt_bytes(needed)} more ({needed} bytes){extra}, "
            f"only {fmt_bytes(free)} free ({free} bytes){freeable}; nothing was written"
        )


@dataclass(frozen=True)
class StagedRevision:
    name: str
    revision: str
    staged_at: float
    bytes: int = 0


def protected_pairs(model_dirs: Iterable[str], root: str) -> set[tuple[str, str]]:
    """(name, revision) of each staged directory ``<root>/<name>/<revision>`` among ``model_dirs``
    (the serving and the previous stable deployment's); directories elsewhere protect nothing here."""
    base = root.rstrip("/") + "/"
    pairs: set[tuple[str, str]] = set()
    for d in model_dirs:
        rel = d.rstrip("/").removeprefix(base) if d.startswith(base) else None
        parts = rel.split("/") if rel else []
        if len(parts) == 2 and all(parts):
            pairs.add((parts[0], parts[1]))
    return pairs


def revisions_named_in(text: str, root: str) -> set[tuple[str, str]]:
    """(name, revision) of every ``<root>/<name>/<revision>`` a unit file's text names (its --model):
    weights an installed unit would load are in use, whatever the deployment records say."""
    # The path starts a word (not /srv/models/... for root /models) and the revision ends one.
    pattern = (
        r"(?<![^\s\"'=])"
        + re.escape(root.rstrip("/"))
        + r"/([A-Za-z0-9][A-Za-z0-9._-]*)/([A-Za-z0-9][A-Za-z0-9._-]*)(?=$|[\s\"'/])"
    )
    return {(m.group(1), m.group(2)) for m in re.finditer(pattern, text)}


def reclaim_for(
    staged: Iterable[StagedRevision],
    *,
    keep: int,
    protected: Iterable[tuple[str, str]],
    incoming: StagedRevision,
    needed: int,
) -> list[StagedRevision]:
    """The revisions to remove before staging ``incoming`` so that ``needed`` bytes fit: only those the
    keep-N cleanup would remove once ``incoming`` is staged (it counts as the newest), oldest first,
    no more than needed; never a protected one, never ``incoming`` itself."""
    if needed <= 0:
        return []
    others = [s for s in staged if (s.name, s.revision) != (incoming.name, incoming.revision)]
    doomed = plan_cleanup([*others, incoming], keep=keep, protected={*protected, (incoming.name, incoming.revision)})
    chosen: list[StagedRevision] = []
    for s in sorted(doomed, key=lambda s: s.staged_at):
        if needed <= 0:
            break
        chosen.append(s)
        needed -= s.bytes
    return chosen


def plan_cleanup(
    staged: Iterable[StagedRevision], *, keep: int, protected: Iterable[tuple[str, str]]
) -> list[StagedRevision]:
    """Revisions to remove so that each model keeps its ``keep`` newest; protected ones never go."""
    if keep < 0:
        raise WeightsError(f"cleanup keep={keep} must be >= 0")
    guard = set(protected)
    by_name: dict[str, list[StagedRevision]] = {}
    for s in staged:
        by_name.setdefault(s.name, []).append(s)
    doomed: list[StagedRevision] = []
    for revisions in by_name.values():
        revisions.sort(key=lambda s: s.staged_at, reverse=True)
        doomed.extend(s for s in revisions[keep:] if (s.name, s.revision) not in guard)
    return sorted(doomed, key=lambda s: (s.name, s.staged_at))
