"""doctor's verdicts (core/doctor.py): observations in, one ok / warn / fail line with its fix out."""

from __future__ import annotations

from orchestrator.core import doctor as d
from orchestrator.core.access import Account, PathStat, Walk
from orchestrator.core.observed import GpuInfo, GpuProcess, GpuSnapshot

VLLM = Account("vllm", 999, frozenset({995}))
DIR, FILE, CHR = 0o040000, 0o100000, 0o020000


def test_report_fails_on_any_fail_line() -> None:
    """One fail among oks makes the report not ok; warns alone do not."""
    assert d.report("h", [d.ok("a", "x"), d.Verdict("b", "warn", "y")])["ok"] is True
    assert d.report("h", [d.ok("a", "x"), d.Verdict("b", "fail", "y", "z")])["ok"] is False


def test_lines_put_the_fix_under_its_check() -> None:
    """The text report: the status, the check and its detail on one line, the fix on the next."""
    out = d.lines(d.report("h1", [d.Verdict("disk", "fail", "full", "free space")]))
    assert out == ["host h1:", "  fail disk: full", "       fix: free space"]


def test_engine_under_root_fails_naming_root_and_the_user() -> None:
    """The shipped example's engine for user vllm: the engine path check fails at /root, with a fix."""
    stats = {p: PathStat(p, DIR | m, 0, 0) for p, m in (("/", 0o755), ("/root", 0o700))}
    v = d.access_verdict("engine path", "the engine", Walk("/root/ml-env/bin/python3", stats), VLLM, "exec")
    assert v.status == "fail" and "user vllm cannot enter /root " in v.detail and v.fix


def test_engine_import_failure_shows_the_last_lines() -> None:
    """A non-zero exit of the import: fail with the tail of what it printed."""
    run = d.parse_engine_run(1, "Traceback\nModuleNotFoundError: No module named 'vllm'\n")
    [v] = d.engine_verdicts("m", "vllm", "/usr/bin/python3", run, [])
    assert v.status == "fail" and "No module named 'vllm'" in v.detail


def test_flags_the_model_needs_are_looked_up() -> None:
    """sleep and expert parallel need their flags; a vLLM without --enable-sleep-mode fails the flags line."""
    run = d.parse_engine_run(0, "version 0.6.0\nflag --model\nflag --enable-expert-parallel\n")
    engine, flags = d.engine_verdicts("m", "vllm", "/e/python3", run, d.needed_flags(True, True))
    assert engine.status == "ok" and "0.6.0" in engine.detail
    assert flags.status == "fail" and flags.detail == "vLLM 0.6.0 has no --enable-sleep-mode"


def test_unreadable_flags_warn() -> None:
    """An import that could not read the parser: the flags are unchecked, a warn."""
    run = d.parse_engine_run(0, "version 0.9.0\nnoflags ImportError x\n")
    assert d.engine_verdicts("m", "vllm", "/e/python3", run, ["--enable-sleep-mode"])[1].status == "warn"


def test_a_non_python_engine_warns() -> None:
    """`vllm serve` as engine: doctor cannot import with it, says so as a warn with the fix."""
    assert not d.is_python("/opt/vllm/bin/vllm") and d.is_python("/usr/bin/python3.11")
    [v] = d.engine_verdicts("m", "vllm", "/opt/vllm/bin/vllm", None, [])
    assert v.status == "warn" and v.fix


def test_sharded_weights_need_their_index() -> None:
    """Two shards without model.safetensors.index.json: fail naming the index."""
    stats = {"/": PathStat("/", DIR | 0o755, 0, 0), "/w": PathStat("/w", DIR | 0o755, 0, 0)}
    v = d.weights_verdict(
        "m",
        "/w",
        ["config.json", "a.safetensors", "b.safetensors"],
        VLLM,
        {"/w": Walk("/w", stats)},
        staged_expected=False,
    )
    assert v.status == "fail" and "model.safetensors.index.json" in v.detail


def test_unstaged_hub_weights_warn_and_missing_local_ones_fail() -> None:
    """A hub model not staged yet: warn (stage it); a local: folder that is not there: fail."""
    assert d.weights_verdict("m", "/w", None, VLLM, {}, staged_expected=False).status == "warn"
    assert d.weights_verdict("m", "/w", None, VLLM, {}, staged_expected=True).status == "fail"


def test_device_nodes_closed_to_the_user_fail() -> None:
    """/dev/nvidia0 0660 root:root: user vllm cannot open it; none at all is a warn (a CPU host)."""
    stats = {
        "/": PathStat("/", DIR | 0o755, 0, 0),
        "/dev": PathStat("/dev", DIR | 0o755, 0, 0),
        "/dev/nvidia0": PathStat("/dev/nvidia0", CHR | 0o660, 0, 0),
    }
    v = d.devices_verdict({"/dev/nvidia0": Walk("/dev/nvidia0", stats)}, VLLM)
    assert v.status == "fail" and "/dev/nvidia0" in v.detail
    assert d.devices_verdict({}, VLLM).status == "warn"


def test_sleep_budget_above_the_host_ram_fails() -> None:
    """sleep_ram_gib 600 on a 512 GiB box with a sleeping model: fail naming the key."""
    v = d.ram_verdict(None, 600.0, 600.0, 512.0, ["m"])
    assert v.status == "fail" and "sleep_ram_gib 600" in v.detail


def test_gpu_line_names_who_holds_what() -> None:
    """The GPU line: count, model, memory, driver and each process holding memory."""
    snap = GpuSnapshot((GpuInfo(0, "u0", "H200", 143771, 1000),), (GpuProcess(7, "python", "u0", 1000, 0),))
    v = d.gpu_verdict(snap, None, "570.1")
    assert v.status == "ok" and "1 x H200" in v.detail and "driver 570.1" in v.detail and "PID 7 python" in v.detail


def test_a_foreign_port_holder_fails() -> None:
    """A port held by something not ours: fail naming the holder."""
    v = d.port_verdict("alpha's engine", 8101, 'users:(("nginx",pid=5,fd=6))')
    assert v.status == "fail" and "nginx" in v.detail


def test_low_disk_warns() -> None:
    """Under 10 GiB free in models_dir: warn."""
    assert d.disk_verdict("/models", 5 * d.GIB).status == "warn"
    assert d.disk_verdict("/models", 500 * d.GIB).status == "ok"


def test_a_console_scripts_python_is_found_from_its_shebang() -> None:
    """`vllm serve`'s script names its venv's python on its first line; a binary or a shell script: None."""
    assert d.shebang_python(b"#!/opt/vllm/bin/python3\n# -*- coding: utf-8 -*-\n") == "/opt/vllm/bin/python3"
    assert d.shebang_python(b"\x7fELF\x02\x01") is None and d.shebang_python(b"#!/bin/sh\n") is None
