"""Sources beyond the hub (a local directory, a peer host over rsync+SSH) and the keep-N cleanup."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from huggingface_hub import snapshot_download

from orchestrator.adapters.local_shell import LocalShell
from orchestrator.adapters.weights import SpecWeights
from orchestrator.adapters.weights_hf import HfWeightStore
from orchestrator.core.catalog import Catalog, Host
from orchestrator.core.records import UnitSpec
from orchestrator.core.weights import MANIFEST_NAME, PROTECT_NAME, Manifest, PeerSpec, StageRequest
from orchestrator.errors import WeightsError
from tests.hubstub import HubStub, StubRepo, sharded_model
from tests.hubstub.runner import LocalRunner, SshRunner

SHA = "0123456789abcdef0123456789abcdef01234567"
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


@pytest.fixture
def hub() -> Iterator[HubStub]:
    with HubStub() as stub:
        stub.add(StubRepo.of("org/tiny", sharded_model(SHARDS, 1024), sha=SHA))
        yield stub


@pytest.fixture
def store(tmp_path: Path) -> HfWeightStore:
    return HfWeightStore(LocalRunner(env={"HF_HOME": str(tmp_path / "hf-home")}), python=sys.executable)


def stage(store: HfWeightStore, req: StageRequest) -> Manifest:
    return store.stage(req, lambda e, f: None)


def from_hub(hub: HubStub, root: Path, revision: str = SHA) -> StageRequest:
    return StageRequest(name="tiny", repo="org/tiny", revision=revision, root=str(root), endpoint=hub.url)


def from_source(root: Path, source: str, peer: PeerSpec | None = None) -> StageRequest:
    return StageRequest(name="tiny", repo="org/tiny", revision=SHA, root=str(root), source=source, peer=peer)


def test_local_directory_on_the_same_disk_is_hardlinked_and_verified(
    hub: HubStub, store: HfWeightStore, tmp_path: Path
) -> None:
    """Staging from a staged copy on the same filesystem links the files and writes a manifest."""
    first = stage(store, from_hub(hub, tmp_path / "a"))
    manifest = stage(store, from_source(tmp_path / "b", f"local:{first.path}"))
    staged = Path(manifest.path)
    assert manifest.files == first.files and manifest.source == f"local:{first.path}"
    assert (staged / SHARDS[0]).stat().st_ino == (Path(first.path) / SHARDS[0]).stat().st_ino
    assert (staged / MANIFEST_NAME).is_file()


def test_hugging_face_cache_snapshot_is_staged_as_regular_files(
    hub: HubStub, store: HfWeightStore, tmp_path: Path
) -> None:
    """A cache snapshot of symlinks into blobs/ stages as real files of the right sizes."""
    snap = Path(
        snapshot_download("org/tiny", revision=SHA, cache_dir=tmp_path / "cache", endpoint=hub.url, token=False)
    )
    assert (snap / SHARDS[0]).is_symlink()
    manifest = stage(store, from_source(tmp_path / "models", f"local:{snap}"))
    staged = Path(manifest.path)
    assert not (staged / SHARDS[0]).is_symlink()
    assert (staged / SHARDS[0]).stat().st_size == hub.repos["org/tiny"].files[SHARDS[0]].size


def test_local_directory_missing_a_shard_is_refused(hub: HubStub, store: HfWeightStore, tmp_path: Path) -> None:
    """A local source whose index names a shard it lacks fails and stages nothing."""
    first = stage(store, from_hub(hub, tmp_path / "a"))
    src = tmp_path / "plain"
    src.mkdir()
    for name in first.files:
        if name != SHARDS[1]:
            (src / name).write_bytes((Path(first.path) / name).read_bytes())
    with pytest.raises(WeightsError, match=f"shard {SHARDS[1]} named in model.safetensors.index.json"):
        stage(store, from_source(tmp_path / "b", f"local:{src}"))
    assert store.verify(str(tmp_path / "b"), "tiny", SHA) is None


@dataclass(frozen=True)
class Sshd:
    address: str
    port: int
    key: str
    known_hosts: str


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    """A real sshd on 127.0.0.9, key login only, with its own host key and known_hosts."""
    d = tmp_path / "sshd"
    d.mkdir()
    address, port = "127.0.0.9", _free_port("127.0.0.9")
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"[{address}]:{port} {host_pub[0]} {host_pub[1]}\n")
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress {address}\nHostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPasswordAuthentication no\nStrictModes no\n"
        f"PermitRootLogin prohibit-password\nUsePAM no\nPidFile {d / 'sshd.pid'}\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.DEVNULL)
    try:
        _await_listening(address, port, proc)
        yield Sshd(address, port, str(d / "client_key"), str(d / "known_hosts"))
    finally:
        proc.terminate()
        proc.wait(10)


def _await_listening(address: str, port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(500):
        assert proc.poll() is None, "sshd exited"
        try:
            socket.create_connection((address, port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"sshd never listened on {address}:{port}")


def test_peer_host_copy_over_rsync_and_ssh(hub: HubStub, store: HfWeightStore, tmp_path: Path, sshd: Sshd) -> None:
    """A model staged on a peer is pulled with rsync over a real SSH login and verified."""
    peer_root = tmp_path / "peer"
    first = stage(store, from_hub(hub, peer_root))
    hub.requests.clear()
    peer = PeerSpec(
        address=sshd.address, root=str(peer_root), port=sshd.port, key_file=sshd.key, known_hosts=sshd.known_hosts
    )
    manifest = stage(store, from_source(tmp_path / "here", "host:gpu2", peer))
    assert manifest.files == first.files and manifest.source == "host:gpu2"
    assert (Path(manifest.path) / SHARDS[1]).read_bytes() == (Path(first.path) / SHARDS[1]).read_bytes()
    assert hub.requests == []


def test_peer_without_the_model_is_reported(store: HfWeightStore, tmp_path: Path, sshd: Sshd) -> None:
    """A peer that has not staged the revision fails with the path it looked for."""
    peer = PeerSpec(
        address=sshd.address,
        root=str(tmp_path / "empty"),
        port=sshd.port,
        key_file=sshd.key,
        known_hosts=sshd.known_hosts,
    )
    with pytest.raises(WeightsError, match=f"reading {tmp_path}/empty/tiny/{SHA}/{MANIFEST_NAME} on gpu2"):
        stage(store, from_source(tmp_path / "here", "host:gpu2", peer))


def test_stage_runs_on_a_remote_host_over_ssh(hub: HubStub, tmp_path: Path, sshd: Sshd) -> None:
    """Through an SSH shell the worker stages on the remote host and streams progress back."""
    ssh = [
        "ssh",
        "-p",
        str(sshd.port),
        "-i",
        sshd.key,
        "-o",
        f"UserKnownHostsFile={sshd.known_hosts}",
        "-o",
        "BatchMode=yes",
        f"root@{sshd.address}",
    ]
    store = HfWeightStore(SshRunner(ssh), python=sys.executable)
    events: list[tuple[str, dict[str, object]]] = []
    manifest = store.stage(from_hub(hub, tmp_path / "remote"), lambda e, f: events.append((e, f)))
    assert store.verify(str(tmp_path / "remote"), "tiny", SHA) == manifest
    progress = [f for e, f in events if e == "stage_progress"]
    assert progress[-1]["host"] == f"root@{sshd.address}"
    assert progress[-1]["bytes"] == manifest.total_bytes


def _stage_revisions(hub: HubStub, store: HfWeightStore, root: Path, n: int, name: str = "tiny") -> list[str]:
    shas = []
    for i in range(n):
        sha = f"{i:x}" * 40
        repo = hub.repos["org/tiny"]
        repo.sha, repo.branches["main"] = sha, sha
        shas.append(stage(store, replace(from_hub(hub, root, revision="main"), name=name)).revision)
    return shas


def test_cleanup_keeps_newest_and_never_removes_protected(hub: HubStub, store: HfWeightStore, tmp_path: Path) -> None:
    """keep=1 removes old revisions except the protected rollback one."""
    root = tmp_path / "models"
    old, middle, new = _stage_revisions(hub, store, root, 3)
    removed = store.cleanup(str(root), keep=1, protected={("tiny", old)})
    assert [r.revision for r in removed] == [middle]
    assert sorted(os.listdir(root / "tiny")) == sorted([old, new])


def test_removing_a_protected_model_is_refused(hub: HubStub, store: HfWeightStore, tmp_path: Path) -> None:
    """remove() of the active model raises and leaves it staged."""
    root = tmp_path / "models"
    stage(store, from_hub(hub, root))
    with pytest.raises(WeightsError, match=f"model tiny revision {SHA} is protected"):
        store.remove(str(root), "tiny", SHA, protected=[("tiny", SHA)])
    assert store.verify(str(root), "tiny", SHA) is not None


def test_remove_unstages_the_model(hub: HubStub, store: HfWeightStore, tmp_path: Path) -> None:
    """remove() deletes the revision; verify() then reports it as not staged."""
    root = tmp_path / "models"
    stage(store, from_hub(hub, root))
    assert store.remove(str(root), "tiny", SHA) is True
    assert store.verify(str(root), "tiny", SHA) is None


def test_free_bytes_reports_the_volume(store: HfWeightStore, tmp_path: Path) -> None:
    """free_bytes() of a path that does not exist yet answers for its volume (an empty 8 MiB tmpfs)."""
    mount = tmp_path / "vol"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    try:
        assert store.free_bytes(str(mount / "not" / "yet")) == 8 << 20
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("name", ["../../escaped.bin", "/{outside}/abs.bin"])
def test_local_manifest_with_a_name_outside_the_model_dir_is_refused(
    hub: HubStub, store: HfWeightStore, tmp_path: Path, name: str
) -> None:
    """A local source whose manifest lists an absolute or ../ name fails, naming file and repo, and
    neither writes nor unlinks anything outside the staging directory."""
    first = stage(store, from_hub(hub, tmp_path / "a"))
    src = tmp_path / "src"
    shutil.copytree(first.path, src)
    victim = tmp_path / "outside" / "abs.bin"
    victim.parent.mkdir()
    victim.write_bytes(b"keep me")
    name = name.format(outside=str(victim.parent).lstrip("/"))
    manifest = json.loads((src / MANIFEST_NAME).read_text())
    manifest["files"][name] = 7
    (src / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(WeightsError, match=r"file name '.*' listed for org/tiny is not a plain relative path"):
        stage(store, from_source(tmp_path / "b", f"local:{src}"))
    assert victim.read_bytes() == b"keep me"
    assert [p for p in (tmp_path / "b").rglob("*")] == []


def test_hostile_peer_user_is_refused_by_the_worker_before_ssh(tmp_path: Path) -> None:
    """A peer user that ssh would read as -oProxyCommand is refused by the worker; no command runs."""
    pwned = tmp_path / "pwned"
    req = from_source(
        tmp_path / "here", "host:gpu2", PeerSpec(address="127.0.0.9", root=str(tmp_path / "peer"))
    ).to_dict()
    req["peer"] = {**req["peer"], "user": f"-oProxyCommand=touch {pwned}"}  # type: ignore[dict-item]
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.worker.stage", "stage", json.dumps(req)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 3
    assert "ssh user '-oProxyCommand=touch" in json.loads(out.stdout.splitlines()[-1])["message"]
    assert not list(tmp_path.glob("pwned*"))


def _unit(model_dir: str, revision: str, source: str = "hub") -> UnitSpec:
    return UnitSpec(
        model="tiny",
        unit_name="vllm-tiny.service",
        unit_text="",
        unit_sha="",
        served_name="tiny",
        address="127.0.0.1",
        port=8000,
        gpus=(0,),
        load_deadline_s=60.0,
        model_dir=model_dir,
        repo="org/tiny",
        revision=revision,
        source=source,
    )


def test_host_source_is_wired_from_the_catalog_and_copies_from_the_peer(
    hub: HubStub, store: HfWeightStore, host_dir: Path, sshd: Sshd
) -> None:
    """A catalog model with source = "host:gpu2" stages through SpecWeights from gpu2's catalog entry
    (its weight root holds a space)."""
    peer_root = host_dir / "peer models"
    stage(store, replace(from_hub(hub, peer_root), name="org--tiny"))
    catalog = Catalog.model_validate(
        {
            "hosts": {
                "gpu1": {"transport": "local", "models_dir": str(host_dir / "here")},
                "gpu2": {
                    "address": sshd.address,
                    "ssh_port": sshd.port,
                    "ssh_key": sshd.key,
                    "known_hosts": sshd.known_hosts,
                    "models_dir": str(peer_root),
                },
            },
            "models": {
                "tiny": {"host": "gpu1", "repo": "org/tiny", "revision": SHA, "gpus": [0], "source": "host:gpu2"}
            },
        }
    )
    weights = SpecWeights(store, catalog.hosts["gpu1"], None, fleet=catalog.hosts)
    hub.requests.clear()
    staged = weights.stage(_unit("", SHA, catalog.models["tiny"].source), lambda e, f: None)
    assert staged.path == f"{host_dir}/here/org--tiny/{SHA}"
    assert (Path(staged.path) / SHARDS[0]).read_bytes() == (peer_root / "org--tiny" / SHA / SHARDS[0]).read_bytes()
    assert hub.requests == []


def test_cleanup_after_a_switch_keeps_newest_serving_and_previous(hub: HubStub, host_dir: Path) -> None:
    """SpecWeights.cleanup with keep=1 removes old revisions except the newest, the serving and the
    previous stable one, and records those two on the host."""
    root = host_dir / "models"
    store = HfWeightStore(LocalShell(), python=sys.executable)
    shas = _stage_revisions(hub, store, root, 4, name="org--tiny")
    weights = SpecWeights(store, Host(name="box", transport="local", models_dir=str(root)), None, keep_revisions=1)
    serving, previous = (_unit(f"{root}/org--tiny/{sha}", sha) for sha in shas[:2])
    removed = weights.cleanup([serving, previous])
    assert [r.revision for r in removed] == [shas[2]]
    assert sorted(os.listdir(root / "org--tiny")) == sorted([shas[0], shas[1], shas[3]])
    assert json.loads((root / PROTECT_NAME).read_text())["protected"] == sorted(
        [["org--tiny", shas[0]], ["org--tiny", shas[1]]]
    )


def test_cleanup_never_removes_a_revision_an_installed_unit_names(hub: HubStub, host_dir: Path) -> None:
    """A revision that a vllm-*.service unit on the host loads (another model's, on other GPUs) stays,
    even when no deployment record protects it."""
    root, units = host_dir / "models", host_dir / "units"
    units.mkdir()
    store = HfWeightStore(LocalShell(), python=sys.executable)
    shas = _stage_revisions(hub, store, root, 3, name="org--tiny")
    (units / "vllm-other.service").write_text(
        f"[Service]\nExecStart=/opt/vllm/bin/vllm serve --model {root}/org--tiny/{shas[0]} --port 8001\n"
    )
    weights = SpecWeights(
        store, Host(name="box", transport="local", models_dir=str(root), unit_dir=str(units)), None, keep_revisions=1
    )
    assert [r.revision for r in weights.cleanup([])] == [shas[1]]
    assert sorted(os.listdir(root / "org--tiny")) == sorted([shas[0], shas[2]])


def test_staging_frees_room_from_old_revisions_but_never_protected_ones(
    hub: HubStub, store: HfWeightStore, small_disk: Path
) -> None:
    """On a 20 MiB disk holding two 8 MiB revisions, a third stages by removing the older unprotected
    one (as keep=2 would after the switch); the protected one stays."""
    hub.repos["org/tiny"] = StubRepo.of("org/tiny", sharded_model(SHARDS, 1 << 20), sha=SHA)
    root = small_disk / "models"
    old, serving = _stage_revisions(hub, store, root, 2)
    store.cleanup(str(root), keep=2, protected={("tiny", serving)})  # what the last switch recorded
    repo = hub.repos["org/tiny"]
    repo.sha = repo.branches["main"] = "e" * 40
    events: list[tuple[str, dict[str, object]]] = []
    req = replace(from_hub(hub, root, revision="main"), keep_revisions=2)
    manifest = store.stage(req, lambda e, f: events.append((e, f)))
    assert sorted(os.listdir(root / "tiny")) == sorted([serving, manifest.revision])
    assert [(f["revision"], f["reason"]) for e, f in events if e == "stage_cleanup"] == [(old, "room for staging")]
