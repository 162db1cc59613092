"""Sleep, wake and their memory checks (deploy/warm.py) on the fake host's engines."""

from __future__ import annotations

import pytest

from orchestrator.deploy.warm import EngineProcess, check_wake_fits, sleep_verified, wake_checked
from orchestrator.errors import EngineWedged, GpuBusy, SleepLeftMemory
from orchestrator.testing import FakeEngineControl, FakeGpus, FakeHost

UNIT = 'ExecStart=vllm "--port" "{port}" "--served-model-name" "{name}"\nEnvironment=CUDA_VISIBLE_DEVICES={gpus}\n'


def started(host: FakeHost, name: str, port: int, gpus: str = "0") -> EngineProcess:
    """A running fake engine on ``gpus``, as the warm code sees it."""
    unit = f"vllm-{name}.service"
    host.ports().systemd.install_unit(unit, UNIT.format(port=port, name=name, gpus=gpus))
    host.ports().systemd.daemon_reload()
    host.ports().systemd.start(unit)
    pids = frozenset(host.ports().systemd.cgroup_pids(unit))
    return EngineProcess(
        name, f"http://127.0.0.1:{port}", tuple(int(g) for g in gpus.split(",")), pids, utilization=0.7
    )


@pytest.fixture
def host() -> FakeHost:
    return FakeHost(gpu_count=2, gpu_mib=100_000)


def test_sleep_leaves_only_the_residue(host: FakeHost) -> None:
    """A sleep that gives the GPU back passes the check; the engine says it sleeps."""
    a = started(host, "a", 8000)
    control = FakeEngineControl(host)
    sleep_verified(control, FakeGpus(host), host.clock, a, level=1, residue_mib=2_000)
    assert control.is_sleeping(a.base_url)


def test_sleep_that_keeps_memory_names_pid_and_mib(host: FakeHost) -> None:
    """A sleep answering 200 that keeps its memory raises SleepLeftMemory with the PID and MiB it holds."""
    a = started(host, "a", 8000)
    host.engine_behaviours["vllm-a.service"] = "leaky_sleep"
    with pytest.raises(SleepLeftMemory) as info:
        sleep_verified(FakeEngineControl(host), FakeGpus(host), host.clock, a, level=1, residue_mib=2_000)
    assert f"PID {min(a.pids)} holds 70000 MiB on GPU 0" in str(info.value) and "2000 MiB residue" in str(info.value)


def test_wake_fits_beside_a_sleepers_residue(host: FakeHost) -> None:
    """A's GPU holding only B's residue (B asleep) is fit for A's wake."""
    a = started(host, "a", 8000)
    control = FakeEngineControl(host)
    sleep_verified(control, FakeGpus(host), host.clock, a, level=1, residue_mib=2_000)
    b = started(host, "b", 8001)
    sleep_verified(control, FakeGpus(host), host.clock, b, level=1, residue_mib=2_000)
    check_wake_fits(FakeGpus(host), a, sleepers={min(b.pids): "b"})


def test_wake_refused_while_an_awake_engine_holds_the_gpu(host: FakeHost) -> None:
    """With B awake on A's GPU the wake is refused, naming B's PID and its memory, and A is not touched."""
    a = started(host, "a", 8000)
    control = FakeEngineControl(host)
    sleep_verified(control, FakeGpus(host), host.clock, a, level=1, residue_mib=2_000)
    b = started(host, "b", 8001)
    with pytest.raises(GpuBusy) as info:
        check_wake_fits(FakeGpus(host), a, sleepers={})
    assert f"PID {min(b.pids)} (VLLM::EngineCore) holds 70000 MiB on GPU 0" in str(info.value)
    assert control.is_sleeping(a.base_url)


def test_wake_refused_when_a_sleeper_keeps_more_than_the_room_allows(host: FakeHost) -> None:
    """A sleeper holding more than its residue blocks A's wake when the memory left is short: named as
    the sleeping model with its MiB, beside the MiB the wake needs."""
    a = started(host, "a", 8000)
    sleep_verified(FakeEngineControl(host), FakeGpus(host), host.clock, a, level=1, residue_mib=2_000)
    host.hold([0], 40_000, "VLLM::EngineCore", "vllm-c.service")
    pid = max(host.holders)
    with pytest.raises(GpuBusy) as info:
        check_wake_fits(FakeGpus(host), a, sleepers={pid: "c"})
    assert "GPU 0 has 58200 MiB free, the wake needs 69224 MiB more" in str(info.value)
    assert f"PID {pid} (sleeping c) holds 40000 MiB on GPU 0" in str(info.value)


def test_a_foreign_process_that_leaves_room_does_not_block_a_wake(host: FakeHost) -> None:
    """Memory decides, not who holds it: a process that is no engine of ours, with the wake's need
    still free beside it, lets A wake (the rollback refused with 90.8 GiB free and 85.4 GiB needed)."""
    a = started(host, "a", 8000)
    sleep_verified(FakeEngineControl(host), FakeGpus(host), host.clock, a, level=1, residue_mib=2_000)
    host.hold([0], 8_000, "python")
    check_wake_fits(FakeGpus(host), a, sleepers={})


def test_wake_then_completion_serves(host: FakeHost) -> None:
    """A level-1 wake with room ends awake and answering."""
    a = started(host, "a", 8000)
    control = FakeEngineControl(host)
    sleep_verified(control, FakeGpus(host), host.clock, a, level=1, residue_mib=2_000)
    wake_checked(control, host.clock, a, level=1, deadline_s=5)
    assert not control.is_sleeping(a.base_url)


def test_level2_wake_follows_vllms_sequence(host: FakeHost) -> None:
    """Level 2 wakes weights, reloads them, then wakes the KV cache."""
    a = started(host, "a", 8000)
    control = FakeEngineControl(host)
    sleep_verified(control, FakeGpus(host), host.clock, a, level=2, residue_mib=2_000)
    wake_checked(control, host.clock, a, level=2, deadline_s=5)
    assert [c for c in host.calls if c.startswith(("wake", "reload"))] == [
        "wake vllm-a.service tags=weights",
        "reload_weights vllm-a.service",
        "wake vllm-a.service tags=kv_cache",
    ]


def test_failed_wake_is_wedged_with_the_engines_words(host: FakeHost) -> None:
    """A wake answering 500 raises EngineWedged carrying vLLM's status and message."""
    a = started(host, "a", 8000)
    control = FakeEngineControl(host)
    sleep_verified(control, FakeGpus(host), host.clock, a, level=1, residue_mib=2_000)
    host.engine_behaviours["vllm-a.service"] = "wedged_wake"
    with pytest.raises(EngineWedged) as info:
        wake_checked(control, host.clock, a, level=1, deadline_s=5)
    assert info.value.status == 500 and "CUDA Error: out of memory" in str(info.value)


def test_wake_without_the_memory_wedges_and_a_second_wake_fails_too(host: FakeHost) -> None:
    """Woken while another engine holds its GPU, the fake engine wedges for good, as vLLM does."""
    a = started(host, "a", 8000)
    control = FakeEngineControl(host)
    sleep_verified(control, FakeGpus(host), host.clock, a, level=1, residue_mib=2_000)
    started(host, "b", 8001)
    with pytest.raises(EngineWedged, match="out of memory"):
        wake_checked(control, host.clock, a, level=1, deadline_s=5)
    with pytest.raises(EngineWedged, match="invalid argument"):
        wake_checked(control, host.clock, a, level=1, deadline_s=5)


def test_woken_engine_whose_completion_hangs_is_wedged_at_the_deadline(host: FakeHost) -> None:
    """A wake answering 200 whose completion gets no answer within wake_deadline_s is wedged, and says so."""
    a = started(host, "a", 8000)
    control = FakeEngineControl(host)
    sleep_verified(control, FakeGpus(host), host.clock, a, level=1, residue_mib=2_000)
    host.engine_behaviours["vllm-a.service"] = "hangs_after_wake"
    with pytest.raises(EngineWedged, match=r"wake_deadline_s 3\): .*no answer"):
        wake_checked(control, host.clock, a, level=1, deadline_s=3)
