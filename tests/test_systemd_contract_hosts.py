"""The Systemd port's contract, run against both adapters on a real booted host.

``adapters`` runs each test twice: D-Bus (pydbus) inside the host and SSH (fabric) from here.
"""

from __future__ import annotations

import signal
import time
import uuid

import pytest

from orchestrator.errors import SystemdError, UnitNotFound, UsageError
from tests.hosts.fixtures import WITH_FAKES, Adapters
from tests.hosts.wait import wait_for

pytestmark = pytest.mark.hosts


def unit_name(prefix: str = "t") -> str:
    """A fresh unit name per test: the journal outlives the reset between tests."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}.service"


def service(exec_start: str, **extra: str) -> str:
    lines = "".join(f"{k}={v}\n" for k, v in extra.items())
    return f"[Unit]\nDescription=contract test\n\n[Service]\nExecStart={exec_start}\n{lines}"


def install(a: Adapters, unit: str, content: str) -> None:
    a.systemd.install_unit(unit, content)
    a.systemd.daemon_reload()


@WITH_FAKES
def test_unknown_unit_reads_as_not_found(adapters: Adapters) -> None:
    """unit_state of a unit systemd does not know is 'not-found', not an error."""
    state = adapters.systemd.unit_state(unit_name())
    assert (state.load_state, state.exists, state.is_active) == ("not-found", False, False)


def test_install_unit_writes_file_read_back(adapters: Adapters) -> None:
    """install_unit writes the text into the unit dir; read_unit returns it."""
    unit, text = unit_name(), service("/bin/sleep 1000")
    adapters.systemd.install_unit(unit, text)
    assert adapters.systemd.read_unit(unit) == text
    assert adapters.host.run(["cat", f"/etc/systemd/system/{unit}"]).stdout == text


@WITH_FAKES
def test_read_unit_of_missing_file_is_none(adapters: Adapters) -> None:
    """read_unit returns None when no unit file exists."""
    assert adapters.systemd.read_unit(unit_name()) is None


@WITH_FAKES
def test_installed_unit_loads_after_daemon_reload(adapters: Adapters) -> None:
    """After daemon_reload the new unit is loaded from its fragment in the unit dir."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sleep 1000"))
    state = adapters.systemd.unit_state(unit)
    assert (state.load_state, state.active_state, state.fragment_path) == (
        "loaded",
        "inactive",
        f"/etc/systemd/system/{unit}",
    )


def test_start_makes_unit_active_with_main_pid(adapters: Adapters) -> None:
    """start returns once the job is done; the unit is active and running with a MainPID."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sleep 1000"))
    adapters.systemd.start(unit)
    state = adapters.systemd.unit_state(unit)
    assert (state.active_state, state.sub_state) == ("active", "running")
    assert state.main_pid > 0


def test_unit_state_reads_a_name_that_must_be_escaped_on_the_bus(adapters: Adapters) -> None:
    """A name with a leading digit, '-', '@' and '_' reads as the unit of that name (the D-Bus adapter
    asks the object path it computes from the name)."""
    unit = f"0{uuid.uuid4().hex[:6]}-x_y@z.service"
    install(adapters, unit, service("/bin/sleep 1000"))
    adapters.systemd.start(unit)
    state = adapters.systemd.unit_state(unit)
    assert (state.active_state, state.fragment_path) == ("active", f"/etc/systemd/system/{unit}")
    assert state.main_pid in adapters.systemd.cgroup_pids(unit)


def test_stop_makes_unit_inactive(adapters: Adapters) -> None:
    """stop waits for the job; the unit is inactive with no MainPID afterwards."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sleep 1000"))
    adapters.systemd.start(unit)
    adapters.systemd.stop(unit)
    state = adapters.systemd.unit_state(unit)
    assert (state.active_state, state.main_pid) == ("inactive", 0)


@WITH_FAKES
def test_stop_of_unknown_unit_is_a_no_op(adapters: Adapters) -> None:
    """Stopping a unit systemd does not know succeeds without doing anything."""
    adapters.systemd.stop(unit_name())


@WITH_FAKES
def test_restart_gives_a_new_main_pid(adapters: Adapters) -> None:
    """restart replaces the running process."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sleep 1000"))
    adapters.systemd.start(unit)
    before = adapters.systemd.unit_state(unit).main_pid
    adapters.systemd.restart(unit)
    after = adapters.systemd.unit_state(unit)
    assert after.is_active and after.main_pid not in (0, before)


@WITH_FAKES
def test_start_of_unknown_unit_raises_unit_not_found(adapters: Adapters) -> None:
    """Starting a unit that does not exist names the unit and the host."""
    unit = unit_name()
    with pytest.raises(UnitNotFound) as err:
        adapters.systemd.start(unit)
    assert unit in str(err.value) and adapters.host.name in str(err.value)


def test_start_job_outlasting_its_timeout_raises(adapters: Adapters) -> None:
    """A start job that does not finish in time raises SystemdError naming the unit."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sleep 60", Type="oneshot"))
    with pytest.raises(SystemdError, match=f"start of {unit}.* did not finish within 1 s"):
        adapters.systemd.start(unit, timeout=1)


def test_invalid_unit_name_is_refused_before_touching_the_host(adapters: Adapters) -> None:
    """A name that is not a unit name (a path, no suffix) raises UsageError and writes nothing."""
    with pytest.raises(UsageError, match="not a valid systemd unit name"):
        adapters.systemd.install_unit("../../tmp/evil.service", "x")
    assert adapters.host.run(["test", "-e", "/tmp/evil.service"], check=False).returncode == 1


def test_unit_exiting_non_zero_is_failed_with_exit_status(adapters: Adapters) -> None:
    """A service whose process exits 3 ends 'failed' with ExecMainStatus 3 and Result exit-code."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sh -c 'exit 3'"))
    adapters.systemd.start(unit)
    state = wait_for(lambda: adapters.systemd.unit_state(unit), lambda s: s.is_failed, what=f"{unit} failed")
    assert (state.exec_main_status, state.result) == (3, "exit-code")


def test_failed_start_job_raises_with_the_journal(adapters: Adapters) -> None:
    """A start job that fails (oneshot exiting 1) raises SystemdError carrying the unit's output."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sh -c 'echo boom-marker; exit 1'", Type="oneshot"))
    with pytest.raises(SystemdError) as err:
        adapters.systemd.start(unit)
    assert unit in str(err.value) and "boom-marker" in str(err.value)


def test_reset_failed_clears_the_failed_state(adapters: Adapters) -> None:
    """reset_failed takes a failed unit back to inactive."""
    unit = unit_name()
    install(adapters, unit, service("/bin/false"))
    adapters.systemd.start(unit)
    wait_for(lambda: adapters.systemd.unit_state(unit), lambda s: s.is_failed, what=f"{unit} failed")
    adapters.systemd.reset_failed(unit)
    assert adapters.systemd.unit_state(unit).active_state == "inactive"


def test_journal_tail_returns_the_last_lines(adapters: Adapters) -> None:
    """journal_tail gives the unit's last N output lines, oldest first."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sh -c 'for i in 1 2 3 4 5; do echo line-$i; done'", Type="oneshot"))
    adapters.systemd.start(unit)
    lines = wait_for(
        lambda: adapters.systemd.journal_tail(unit, 40), lambda ls: "line-5" in ls, what=f"{unit} output in the journal"
    )
    assert [x for x in lines if x.startswith("line-")][-3:] == ["line-3", "line-4", "line-5"]
    assert len(adapters.systemd.journal_tail(unit, 2)) == 2


def test_journal_tail_hides_secrets_the_engine_printed(adapters: Adapters) -> None:
    """An engine that prints a token and a secret-named value: journal_tail returns the lines without them."""
    unit = unit_name()
    hf = "hf_" + "Zx9" * 12
    install(adapters, unit, service(f"/bin/sh -c 'echo token {hf}; echo HF_TOKEN=plainsecret1; echo done-1'"))
    adapters.systemd.start(unit)
    lines = wait_for(
        lambda: adapters.systemd.journal_tail(unit, 40), lambda ls: "done-1" in ls, what=f"{unit} output in the journal"
    )
    text = "\n".join(lines)
    assert hf not in text and "plainsecret1" not in text
    assert "token <a Hugging Face token, not shown>" in lines and "HF_TOKEN=<a secret by its name, not shown>" in lines


def test_daemon_reload_picks_up_a_changed_unit(adapters: Adapters) -> None:
    """After a unit file changes, daemon_reload makes the next start run the new command."""
    unit = unit_name()
    install(adapters, unit, service("/bin/echo version-one", Type="oneshot"))
    adapters.systemd.start(unit)
    adapters.systemd.install_unit(unit, service("/bin/echo version-two", Type="oneshot"))
    adapters.systemd.daemon_reload()
    adapters.systemd.start(unit)
    lines = wait_for(
        lambda: adapters.systemd.journal_tail(unit, 20), lambda ls: "version-two" in ls, what="second version's output"
    )
    assert lines.index("version-one") < lines.index("version-two")


def test_restart_on_failure_counts_restarts(adapters: Adapters) -> None:
    """With Restart=on-failure systemd restarts a crashing service and NRestarts counts it."""
    unit = unit_name()
    content = service("/bin/sh -c 'exit 1'", Restart="on-failure", RestartSec="100ms")
    install(adapters, unit, content.replace("[Unit]\n", "[Unit]\nStartLimitIntervalSec=0\n"))
    adapters.systemd.start(unit)
    state = wait_for(
        lambda: adapters.systemd.unit_state(unit), lambda s: s.n_restarts >= 2, what=f"{unit} restarted twice"
    )
    assert state.n_restarts >= 2


def test_started_at_is_the_last_start_systemds_own_restarts_included(adapters: Adapters) -> None:
    """started_at is when the main process started (epoch s) and moves when Restart= starts it again."""
    unit = unit_name()
    content = service("/bin/sh -c 'sleep 1.2; exit 1'", Restart="on-failure", RestartSec="100ms")
    install(adapters, unit, content.replace("[Unit]\n", "[Unit]\nStartLimitIntervalSec=0\n"))
    assert adapters.systemd.unit_state(unit).started_at is None
    before = time.time()
    adapters.systemd.start(unit)
    first = adapters.systemd.unit_state(unit).started_at
    assert first is not None and before - 1 <= first <= time.time()  # `systemctl show` gives whole seconds
    later = wait_for(
        lambda: adapters.systemd.unit_state(unit),
        lambda s: s.n_restarts >= 1 and s.active_state == "active" and (s.started_at or 0) > first,
        what=f"{unit} restarted by systemd",
    )
    assert later.started_at is not None and later.started_at <= time.time()


def test_enable_and_disable_change_the_install_state(adapters: Adapters) -> None:
    """enable links the unit into its target; disable removes the link."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sleep 1000") + "\n[Install]\nWantedBy=multi-user.target\n")
    adapters.systemd.enable(unit)
    assert adapters.host.run(["systemctl", "is-enabled", unit], check=False).stdout.strip() == "enabled"
    adapters.systemd.disable(unit)
    assert adapters.host.run(["systemctl", "is-enabled", unit], check=False).stdout.strip() == "disabled"


@WITH_FAKES
def test_enable_and_disable_report_whether_a_link_changed(adapters: Adapters) -> None:
    """enable and disable say whether they changed a link (the caller reloads only then)."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sleep 1000") + "\n[Install]\nWantedBy=multi-user.target\n")
    assert [
        adapters.systemd.enable(unit, reload=False),
        adapters.systemd.enable(unit, reload=False),
        adapters.systemd.disable(unit),
        adapters.systemd.disable(unit),
    ] == [True, False, True, False]


@WITH_FAKES
def test_enable_of_unknown_unit_raises_unit_not_found(adapters: Adapters) -> None:
    """Enabling a unit with no unit file names the unit."""
    unit = unit_name()
    with pytest.raises(UnitNotFound, match=unit):
        adapters.systemd.enable(unit)


def test_cgroup_pids_lists_every_process_of_the_unit(adapters: Adapters) -> None:
    """cgroup_pids includes the main process and the children it forked."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sh -c 'sleep 1000 & sleep 1000 & wait'"))
    adapters.systemd.start(unit)
    pids = wait_for(
        lambda: adapters.systemd.cgroup_pids(unit), lambda p: len(p) >= 3, what=f"{unit} forked its children"
    )
    assert adapters.systemd.unit_state(unit).main_pid in pids


def test_cgroup_pids_reads_the_units_sub_cgroups(adapters: Adapters) -> None:
    """A process the unit moved into a cgroup below its own (Delegate=yes) is one of its processes."""
    unit = unit_name()
    script = (  # $$: a literal $ for the shell (systemd expands $NAME in ExecStart itself)
        "root=/sys/fs/cgroup; [ -d $$root/unified ] && root=$$root/unified; "  # a hybrid host's v2 tree
        "cg=$$root$$(sed -n s/^0:://p /proc/self/cgroup); mkdir $$cg/sub; "
        "sleep 1000 & echo $$! > $$cg/sub/cgroup.procs; echo $$! > /run/$$1.sub; wait"
    )
    install(adapters, unit, service(f"/bin/sh -c '{script}' sh {unit}", Delegate="yes"))
    adapters.systemd.start(unit)
    sub = wait_for(
        lambda: adapters.host.run(["cat", f"/run/{unit}.sub"], check=False).stdout.strip(),
        bool,
        what=f"{unit} moved a child into its sub-cgroup",
    )
    where = adapters.host.run(["sed", "-n", "s/^0:://p", f"/proc/{sub}/cgroup"]).stdout.strip()
    assert where.endswith(f"/{unit}/sub"), where
    assert int(sub) in adapters.systemd.cgroup_pids(unit)


@WITH_FAKES
def test_cgroup_pids_of_a_stopped_unit_is_empty(adapters: Adapters) -> None:
    """A unit that is not running has no processes."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sleep 1000"))
    assert adapters.systemd.cgroup_pids(unit) == []


def test_kill_unit_signals_every_process(adapters: Adapters) -> None:
    """kill_unit with SIGKILL ends the service (it fails with Result 'signal')."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sh -c 'sleep 1000 & sleep 1000 & wait'"))
    adapters.systemd.start(unit)
    adapters.systemd.kill_unit(unit, signal.SIGKILL)
    # Settled, not merely not active: 'deactivating' (the kill still reaping) is not active either.
    state = wait_for(
        lambda: adapters.systemd.unit_state(unit),
        lambda s: s.active_state in ("failed", "inactive"),
        what=f"{unit} killed",
    )
    assert (state.active_state, state.result) == ("failed", "signal")
    assert adapters.systemd.cgroup_pids(unit) == []


@WITH_FAKES
def test_remove_unit_deletes_the_file(adapters: Adapters) -> None:
    """remove_unit deletes the unit file; after a reload systemd no longer knows the unit."""
    unit = unit_name()
    install(adapters, unit, service("/bin/sleep 1000"))
    adapters.systemd.remove_unit(unit)
    adapters.systemd.daemon_reload()
    assert adapters.systemd.read_unit(unit) is None
    assert not adapters.systemd.unit_state(unit).exists
