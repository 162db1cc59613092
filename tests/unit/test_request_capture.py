"""bench/loadgen/request_capture.py --order: how a run's requests reached a vLLM server, from its access lines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "loadgen"))
import request_capture  # bench/loadgen/ is a folder of scripts


def access(port: int, request: str) -> str:
    return f'INFO:     127.0.0.1:{port} - "{request} HTTP/1.1" 200 OK'


def test_a_run_shows_new_and_open_connections_between_the_samplers_polls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Calibration on one connection, then 16 completions on new ones: 'Nrr' then 16 'N', runs split at 'mmm'."""
    lines = [access(9000 + i, "GET /metrics") for i in range(3)]
    lines += [access(100, "POST /v1/completions")] * 3
    lines += [access(200 + i, "POST /v1/completions") for i in range(16)]
    lines += [access(9100 + i, "GET /metrics") for i in range(3)]
    log = tmp_path / "server.log"
    log.write_text("\n".join(["(APIServer pid=1) INFO loggers.py: Engine 000: ...", *lines]) + "\n")
    assert request_capture.order(str(log)) == 0
    assert capsys.readouterr().out == "Nrr" + "N" * 16 + "\n"


def test_opened_connections_are_folded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """64 GET /v1/models before the level's completions print as '[64 o]'."""
    lines = [access(9000 + i, "GET /metrics") for i in range(3)]
    lines += [access(300 + i, "GET /v1/models") for i in range(64)]
    lines += [access(300 + i, "POST /v1/completions") for i in range(64)]
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    request_capture.order(str(log))
    assert capsys.readouterr().out == "[64 o]" + "r" * 64 + "\n"
