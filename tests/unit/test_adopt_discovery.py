"""adopt's probes (deploy/adopt.py) against a scripted shell: which units and processes are vLLM engines run
outside the product, and how an adopted process is stopped (its group, SIGKILL after the stop timeout)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from orchestrator.core.observed import CommandResult
from orchestrator.core.records import UnitSpec
from orchestrator.deploy import adopt as d
from orchestrator.deploy.context import StepContext
from orchestrator.ports import HostPorts
from orchestrator.testing import FakeHost

from .conftest import make_catalog

PY = "/usr/bin/python3"
ENGINE = f"{PY} -m vllm.entrypoints.openai.api_server"
HAND = f"[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=0,1\nExecStart={ENGINE} --model /m/a --served-model-name a -tp 2\n"
RENDERED = "# Rendered by orchestrator from templates/vllm.service.j2.\n[Service]\nExecStart=/x/vllm serve --model /m\n"


class ScriptedShell:
    """Answers the commands adopt runs from a table; files (and /proc) from a dict."""

    def __init__(
        self,
        files: dict[str, bytes],
        answers: dict[tuple[str, ...], str],
        on_kill: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.host = "box"
        self.files = files
        self.answers = answers
        self.on_kill = on_kill
        self.ran: list[list[str]] = []

    def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, idempotent: bool = False
    ) -> CommandResult:
        self.ran.append(list(argv))
        if argv[0] == "kill" and self.on_kill is not None:
            self.on_kill(list(argv))
        for prefix, out in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return CommandResult(" ".join(argv), 0, out)
        return CommandResult(" ".join(argv), 0, "")

    def run_streaming(
        self, argv: Sequence[str], on_line: Callable[[str], None], *, timeout: float | None = None
    ) -> CommandResult:
        return self.run(argv)

    def read_file(self, path: str) -> bytes | None:
        return self.files.get(path)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.files[path] = data

    def close(self) -> None:
        pass


def stat(pid: int, ppid: int, pgrp: int, start: int) -> bytes:
    """/proc/PID/stat with a command name holding a space and a parenthesis, as the kernel may write it."""
    fields = ["S", str(ppid), str(pgrp)] + ["0"] * 16 + [str(start)] + ["0"] * 5
    return f"{pid} (python3 (x)) ".encode() + " ".join(fields).encode()


def proc_row(pid: int, argv: list[str], environ: dict[str, str], cgroup: str) -> str:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    env = "".join(f"{k}={v}\0" for k, v in environ.items())
    return f"P {pid} root\nC {b64(chr(0).join(argv) + chr(0))}\nE {b64(env)}\nG {b64(cgroup)}\n"


def ports_with(shell: ScriptedShell) -> HostPorts:
    return replace(FakeHost(name="box").ports(), shell=shell)


def test_units_and_hand_run_processes_are_found() -> None:
    """A hand-written unit and two hand-run engines (a login's scope, ssh.service without pam_systemd) are found;
    a rendered unit, the unit's own process and a forked child are not."""
    argv = [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/b", "--served-model-name", "b"]
    serve = ["/opt/v/bin/python3", "/opt/v/bin/vllm", "serve", "/m/c", "--served-model-name", "c"]
    rows = (
        proc_row(100, argv[:4] + ["/m/a"], {}, "0::/system.slice/vllm-a.service\n")
        + proc_row(
            200,
            argv,
            {"CUDA_VISIBLE_DEVICES": "2", "PATH": "/bin", "HF_TOKEN": "x"},
            "0::/user.slice/user-0.slice/session-3.scope\n",
        )
        + proc_row(201, argv, {}, "0::/user.slice/user-0.slice/session-3.scope\n")
        + proc_row(300, serve, {}, "0::/system.slice/ssh.service\n")
        + proc_row(400, ["/usr/bin/grep", "vllm"], {}, "0::/user.slice\n")
    )
    files = {
        "/etc/systemd/system/vllm-a.service": HAND.encode(),
        "/etc/systemd/system/vllm-r.service": RENDERED.encode(),
        "/proc/100/stat": stat(100, 1, 100, 5),
        "/proc/200/stat": stat(200, 1, 200, 7),
        "/proc/201/stat": stat(201, 200, 200, 8),
        "/proc/300/stat": stat(300, 1, 300, 9),
    }
    shell = ScriptedShell(
        files,
        {
            (
                "systemctl",
                "list-units",
            ): "vllm-a.service loaded active running a\nvllm-r.service loaded active running r\n"
            "ssh.service loaded active running OpenBSD sshd\n",
            # systemd prints a unit's properties in its own order: ExecStart before Id
            ("systemctl", "show", "-p", "Id", "-p", "ExecStart"): (
                f"ExecStart={{ path={PY} ; argv[]={ENGINE} --model /m/a ; }}\nId=vllm-a.service\n\n"
                "ExecStart={ path=/x/vllm ; argv[]=/x/vllm serve --model /m ; }\nId=vllm-r.service\n\n"
                "ExecStart={ path=/usr/sbin/sshd ; argv[]=/usr/sbin/sshd -D ; }\nId=ssh.service\n"
            ),
            (
                "systemctl",
                "show",
                "-p",
                "FragmentPath",
                "-p",
                "DropInPaths",
                "--",
                "vllm-a.service",
            ): "FragmentPath=/etc/systemd/system/vllm-a.service\nDropInPaths=\n",
            (
                "systemctl",
                "show",
                "-p",
                "FragmentPath",
                "-p",
                "DropInPaths",
                "--",
                "vllm-r.service",
            ): "FragmentPath=/etc/systemd/system/vllm-r.service\nDropInPaths=\n",
            ("sh", "-c"): rows,
        },
    )
    found = d.discover(ports_with(shell), [], [], ours=set())
    assert [(f.unit, f.pid) for f in found] == [("vllm-a.service", None), (None, 200), (None, 300)]
    unit, hand, ssh = found
    assert unit.unit_text == HAND and dict(unit.env) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert hand.pid_start == 7 and dict(hand.env) == {"CUDA_VISIBLE_DEVICES": "2", "HF_TOKEN": "x"}
    assert ssh.argv[1:3] == ("/opt/v/bin/vllm", "serve")


def test_named_unit_not_running_is_refused() -> None:
    """A named unit that does not run: exit 2 naming it and its state (adopt records what runs now)."""
    shell = ScriptedShell({}, {})
    try:
        d.discover(ports_with(shell), ["vllm-x.service"], [], ours=set())
    except d.AdoptError as exc:
        assert exc.exit_code == 2 and "unit vllm-x.service is inactive" in str(exc)
    else:
        raise AssertionError("not refused")


def spec(pid: int, start: int) -> UnitSpec:
    return UnitSpec(
        model="b",
        unit_name="vllm-b.service",
        unit_text="",
        unit_sha="",
        served_name="b",
        address="127.0.0.1",
        port=8000,
        gpus=(0,),
        load_deadline_s=30,
        model_dir="/m/b",
        pid=pid,
        pid_start=start,
    )


def ctx_for(shell: ScriptedShell) -> tuple[StepContext, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    return StepContext(
        ports=ports_with(shell), catalog=make_catalog(), progress=lambda e, f: events.append((e, f))
    ), events


def test_adopted_process_group_gets_sigterm() -> None:
    """A setsid engine (its own group leader): SIGTERM to the whole group, and it is gone."""
    files = {"/proc/200/stat": stat(200, 1, 200, 7)}
    shell = ScriptedShell(files, {}, on_kill=lambda argv: files.pop("/proc/200/stat", None))
    ctx, events = ctx_for(shell)
    d.stop_processes(ctx, [spec(200, 7)])
    assert [r for r in shell.ran if r[0] == "kill"] == [["kill", "-TERM", "--", "-200"]]
    assert events[0][0] == "stop" and "pid 200" in events[0][1]["unit"]


def test_ignored_sigterm_gets_sigkill_after_the_stop_timeout() -> None:
    """An engine in its shell's group that ignores SIGTERM: SIGKILL to it alone once stop_timeout_s passed."""
    files = {"/proc/200/stat": stat(200, 1, 150, 7)}

    def kill(argv: list[str]) -> None:
        if argv[1] == "-KILL":
            files.pop("/proc/200/stat")

    shell = ScriptedShell(files, {}, on_kill=kill)
    ctx, _ = ctx_for(shell)
    d.stop_processes(ctx, [spec(200, 7)])
    assert [r for r in shell.ran if r[0] == "kill"] == [["kill", "-TERM", "--", "200"], ["kill", "-KILL", "--", "200"]]


def test_a_recycled_pid_is_left_alone() -> None:
    """The PID runs another process now (another start time): nothing is signalled."""
    shell = ScriptedShell({"/proc/200/stat": stat(200, 1, 200, 99)}, {})
    ctx, _ = ctx_for(shell)
    d.stop_processes(ctx, [spec(200, 7)])
    assert not [r for r in shell.ran if r[0] == "kill"]
