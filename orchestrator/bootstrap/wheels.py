"""This machine's side of `agent install`: the package wheel from the local tree and the wheels it needs.

A box may have no internet (and test hosts reach package registries only through this machine),
so every dependency travels as a wheel: they are resolved here once, with this machine's pip and
its configured indexes, into a cache (``$ORCHESTRATOR_WHEELHOUSE``, else
``~/.cache/orchestrator/wheelhouse/cp311-x86_64``) and installed on the box with ``--no-index``.
Wheels with compiled parts (pydantic-core, aiohttp, ...) match this machine's interpreter, so the
box's Python must have the same minor version and architecture, or ``--wheelhouse DIR`` must hold
wheels built for the box. PyGObject is not shipped: it compiles against the box's GLib, so the box
venv uses the distribution's ``python3-gi`` (``--system-site-packages``).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import OrchestratorError, UsageError

# Pure-Python extras the agent needs on the box besides the package's own dependencies.
EXTRA_REQUIREMENTS = ("pydbus>=0.6",)
_TREE_PARTS = ("pyproject.toml", "README.md", "orchestrator", "templates")
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


@dataclass(frozen=True)
class PackageWheel:
    """The orchestrator wheel and a fingerprint of its contents (not of the zip: timestamps vary)."""

    path: Path
    version: str
    fingerprint: str  # sha256 over the sorted RECORD lines: the same tree gives the same value

    @property
    def short(self) -> str:
        return self.fingerprint[:12]


def interpreter_tag() -> str:
    """cp<major><minor>-<arch> of this interpreter: what the cached dependency wheels fit."""
    return f"cp{sys.version_info.major}{sys.version_info.minor}-{platform.machine()}"


def source_tree(explicit: str | None = None) -> Path:
    """--source DIR, else the tree this package runs from; it must be the orchestrator project."""
    root = Path(explicit) if explicit else Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    try:
        name = tomllib.loads(pyproject.read_text()).get("project", {}).get("name")
    except (OSError, tomllib.TOMLDecodeError) as exc:
        where = f"--source {explicit}" if explicit else f"the tree this orchestrator runs from ({root})"
        raise UsageError(
            f"{where}: no readable pyproject.toml of the orchestrator project ({exc}); "
            "pass --source DIR (a checkout) or --wheel FILE"
        ) from None
    if name != "orchestrator":
        raise UsageError(f"--source {root}: pyproject.toml names project {name!r}, not 'orchestrator'")
    return root


def _pip(args: list[str], what: str) -> str:
    argv = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise OrchestratorError(f"{what}: `pip {' '.join(args)}` exited {proc.returncode}:\n{tail}")
    return proc.stdout


def build(tree: Path, out_dir: Path) -> PackageWheel:
    """pip wheel --no-deps of a clean copy of the tree (no build/ left-overs, nothing written into it)."""
    with tempfile.TemporaryDirectory(prefix="orchestrator-src-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for part in _TREE_PARTS:
            path = tree / part
            if path.is_dir():
                shutil.copytree(path, src / part, symlinks=True, ignore=_SKIP)
            elif path.exists():
                shutil.copy2(path, src / part)
        _pip(["wheel", "--no-deps", "-q", "-w", str(out_dir), str(src)], f"building the wheel of {tree}")
    wheels = sorted(out_dir.glob("orchestrator-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise OrchestratorError(f"building the wheel of {tree}: pip wrote no orchestrator-*.whl into {out_dir}")
    return inspect(wheels[-1])


def inspect(path: Path) -> PackageWheel:
    """Version and content fingerprint of an orchestrator wheel (a UsageError for anything else)."""
    try:
        with zipfile.ZipFile(path) as zf:
            record = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
            if record is None or not Path(record).parent.name.startswith("orchestrator-"):
                raise UsageError(f"wheel {path}: not an orchestrator wheel (no orchestrator-*.dist-info/RECORD)")
            lines = sorted(
                line for line in zf.read(record).decode().splitlines() if line and not line.startswith(record)
            )
    except (OSError, zipfile.BadZipFile) as exc:
        raise UsageError(f"wheel {path}: cannot read it as a wheel ({exc})") from None
    version = Path(record).parent.name.removeprefix("orchestrator-").removesuffix(".dist-info")
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return PackageWheel(path=path, version=version, fingerprint=digest)


def default_cache() -> Path:
    env = os.environ.get("ORCHESTRATOR_WHEELHOUSE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "orchestrator" / "wheelhouse" / interpreter_tag()


def dependencies(package: PackageWheel, cache: Path) -> list[Path]:
    """Every wheel the package and EXTRA_REQUIREMENTS need, in cache: offline from it when it already has
    them, else resolved once with this machine's pip (its indexes) and kept for the next box."""
    cache.mkdir(parents=True, exist_ok=True)
    wanted = [str(package.path), *EXTRA_REQUIREMENTS]
    common = ["wheel", "-q", "-w", str(cache), "--find-links", str(cache)]
    try:
        _pip([*common, "--no-index", *wanted], "resolving from the wheel cache")
    except OrchestratorError:
        _pip([*common, *wanted], f"fetching the dependency wheels into {cache}")
    for built in cache.glob("orchestrator-*.whl"):
        built.unlink()  # the package itself travels on its own, under its fingerprint
    return sorted(cache.glob("*.whl"))
