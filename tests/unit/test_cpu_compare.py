"""bench/loadgen/cpu_compare.sh: its own flags, checked before it starts a server."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "loadgen" / "cpu_compare.sh"


def test_pinning_the_engine_alone_is_refused_naming_both_flags(tmp_path: Path) -> None:
    """--pin-engine without --pin-clients exits 2 naming both values, before any server starts."""
    got = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out"), "--pin-engine", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert got.returncode == 2
    assert "--pin-engine and --pin-clients go together (got '0' and '')" in got.stderr
    assert not (tmp_path / "out.server.log").exists()
