"""The NVML probe's figures (nvidia-smi's MiB, its process names) and a host's `gpu_probe` setting."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchestrator.adapters.nvml import mib, proc_name
from tests.builders.toml import Template

DOC = Template(
    """
state_dir = "/var/lib/orchestrator"
[hosts.box]
transport = "{transport}"
gpus = 1
gpu_memory_gib = 141
{host}
[models.a]
repo = "org/a"
gpus = [0]
port = 8001
""",
    defaults={"transport": "local"},
)


def test_bytes_read_as_nvidia_smis_mib_rounded_down() -> None:
    """MiB is bytes // 2**20, as nvidia-smi's nounits figures (20998 MiB and a few bytes: 20998)."""
    assert [mib(20998 * 2**20), mib(20998 * 2**20 + 2**20 - 1), mib(2**20 - 1)] == [20998, 20998, 0]


def test_memory_nvml_cannot_tell_reads_as_zero() -> None:
    """None (pynvml's "not available") and NVML's all-ones value read 0 MiB, as nvidia-smi's [N/A]."""
    assert (mib(None), mib((1 << 64) - 1)) == (0, 0)


def test_a_process_name_is_its_argv0() -> None:
    """Without NVML's answer a process is named by argv[0] (what vLLM's engine sets), as nvidia-smi names it."""
    proc = subprocess.Popen(["/bin/sh", "-c", "echo started; read x"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"started\n"  # exec'd: its own argv now
        assert proc_name(proc.pid) == "/bin/sh"
    finally:
        proc.kill()
        proc.wait()


def test_a_process_without_argv_is_named_by_comm(tmp_path: Path) -> None:
    """An empty cmdline (a kernel thread) falls back to comm; a gone process is named ""."""
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cmdline").write_bytes(b"")
    (tmp_path / "7" / "comm").write_bytes(b"kworker/0:1\n")
    assert (proc_name(7, proc=str(tmp_path)), proc_name(8, proc=str(tmp_path))) == ("kworker/0:1", "")
    assert proc_name(os.getpid()) != ""


def test_gpu_probe_defaults_to_auto_and_takes_each_mode(tmp_path: Path) -> None:
    """Unset: "auto"; "nvml" (local host) and "nvidia-smi" load as given."""
    assert DOC.load(tmp_path).hosts["box"].gpu_probe == "auto"
    assert DOC.load(tmp_path, host='gpu_probe = "nvml"').hosts["box"].gpu_probe == "nvml"
    assert DOC.load(tmp_path, transport="ssh", host='gpu_probe = "nvidia-smi"').hosts["box"].gpu_probe == "nvidia-smi"


def test_an_unknown_gpu_probe_is_refused(tmp_path: Path) -> None:
    """gpu_probe = "dcgm": exit 2 naming the key, the value and the choices."""
    message = DOC.refused(tmp_path, host='gpu_probe = "dcgm"')
    assert "hosts.box.gpu_probe" in message and "'dcgm'" in message and "nvidia-smi" in message


def test_nvml_on_a_host_over_ssh_is_refused(tmp_path: Path) -> None:
    """gpu_probe = "nvml" over SSH: exit 2, since NVML reads only the agent's own machine."""
    message = DOC.refused(tmp_path, transport="ssh", host='gpu_probe = "nvml"')
    assert "hosts.box.gpu_probe" in message and 'transport = "local"' in message
