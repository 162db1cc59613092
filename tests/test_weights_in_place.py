"""Weights are verified the same way whatever their source, before anything stops: a ``local:``
directory used in place, a staged copy of a local directory and a hub download are each checked
against model.safetensors.index.json (names, sizes), their safetensors headers (the length prefix, the
JSON, tensor offsets inside the file) and the sha256 where one is known (a manifest, a Hugging Face
cache's blob names, the hub's listing). The worker runs for real, in a subprocess, on real files."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import snapshot_download

from orchestrator.adapters.local_shell import LocalShell
from orchestrator.adapters.weights import SpecWeights
from orchestrator.adapters.weights_hf import HfWeightStore
from orchestrator.core.catalog import Host
from orchestrator.core.records import UnitSpec
from orchestrator.core.weights import StageRequest
from orchestrator.errors import WeightsError
from tests.hubstub import HubStub, StubRepo, sharded_model

SHA = "0123456789abcdef0123456789abcdef01234567"
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
FILES = sharded_model(SHARDS, 1024)


@pytest.fixture
def hub() -> Iterator[HubStub]:
    with HubStub() as stub:
        stub.add(StubRepo.of("org/tiny", FILES, sha=SHA))
        yield stub


@pytest.fixture
def store() -> HfWeightStore:
    return HfWeightStore(LocalShell(), python=sys.executable)


def write_model(directory: Path, files: dict[str, bytes] = FILES) -> Path:
    directory.mkdir(parents=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def in_place(store: HfWeightStore, directory: Path, tmp_path: Path, events: list[tuple[str, Any]] | None = None) -> Any:
    weights = SpecWeights(store, Host(name="box", transport="local", models_dir="/srv/unused"), None)
    spec = UnitSpec(
        model="tiny",
        unit_name="vllm-tiny.service",
        unit_text="",
        unit_sha="",
        served_name="tiny",
        address="127.0.0.1",
        port=8000,
        gpus=(0,),
        load_deadline_s=60.0,
        model_dir=str(directory),
        repo="org/tiny",
        revision="local",
        source=f"local:{directory}",
    )
    return weights.stage(spec, lambda e, f: (events if events is not None else []).append((e, f)))


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def header_end(path: Path) -> int:
    return 8 + int(struct.unpack("<Q", path.read_bytes()[:8])[0])


def test_an_intact_directory_in_place_is_accepted_with_what_was_checked(store: HfWeightStore, tmp_path: Path) -> None:
    """A whole model is used where it is; the progress says which checks ran (no sha256 known here)."""
    events: list[tuple[str, Any]] = []
    staged = in_place(store, write_model(tmp_path / "m"), tmp_path, events)
    assert staged.path == str(tmp_path / "m") and staged.total_bytes == sum(len(v) for v in FILES.values())
    [checked] = [f for e, f in events if e == "stage_verified"]
    assert checked["files"] == len(FILES) and checked["sha256_checked"] == 0
    assert "no sha256 known" in checked["checked"]


def test_a_shard_the_index_names_missing_in_place_is_refused_naming_it(store: HfWeightStore, tmp_path: Path) -> None:
    """Deleting a shard that model.safetensors.index.json names fails the check, naming the shard."""
    model = write_model(tmp_path / "m")
    (model / SHARDS[1]).unlink()
    with pytest.raises(WeightsError, match=f"{SHARDS[1]} named in model.safetensors.index.json is missing"):
        in_place(store, model, tmp_path)


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "length prefix past the end": (
        lambda p: p.write_bytes(struct.pack("<Q", 1 << 40) + p.read_bytes()[8:]),
        "header length 1099511627776 is larger than the file",
    ),
    "header not JSON": (lambda p: flip(p, 8), "header is not JSON"),
    "truncated data": (lambda p: p.write_bytes(p.read_bytes()[:-100]), "ends at byte 4096 but the file holds"),
    "extra bytes": (lambda p: p.write_bytes(p.read_bytes() + b"\0" * 8), "are not covered by any tensor"),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_shard_with_a_corrupt_header_in_place_is_refused_naming_it(
    store: HfWeightStore, tmp_path: Path, corruption: str
) -> None:
    """A shard whose safetensors header cannot be what vLLM loads is refused, naming the file and why."""
    model = write_model(tmp_path / "m")
    damage, why = CORRUPTIONS[corruption]
    damage(model / SHARDS[0])
    with pytest.raises(WeightsError, match=SHARDS[0]) as exc:
        in_place(store, model, tmp_path)
    assert why in str(exc.value)


def test_a_tensor_the_index_places_in_a_shard_must_be_in_its_header(store: HfWeightStore, tmp_path: Path) -> None:
    """An index that maps a tensor to a shard whose header lacks it is refused, naming both."""
    index = json.loads(FILES["model.safetensors.index.json"])
    index["weight_map"]["model.layers.9.mlp.weight"] = SHARDS[0]
    model = write_model(tmp_path / "m", {**FILES, "model.safetensors.index.json": json.dumps(index).encode()})
    with pytest.raises(WeightsError, match=f"{SHARDS[0]}: tensor model.layers.9.mlp.weight"):
        in_place(store, model, tmp_path)


def test_a_flipped_data_byte_in_place_is_refused_when_the_manifest_knows_the_sha256(
    hub: HubStub, store: HfWeightStore, tmp_path: Path
) -> None:
    """A staged revision used in place keeps its manifest: a flipped tensor byte fails its sha256."""
    manifest = store.stage(
        StageRequest(name="tiny", repo="org/tiny", revision=SHA, root=str(tmp_path / "hub"), endpoint=hub.url),
        lambda e, f: None,
    )
    shard = Path(manifest.path) / SHARDS[1]
    flip(shard, header_end(shard) + 100)
    with pytest.raises(WeightsError, match=f"{SHARDS[1]} failed its sha256 check") as exc:
        in_place(store, Path(manifest.path), tmp_path)
    assert manifest.sha256[SHARDS[1]] in str(exc.value)


def test_a_flipped_data_byte_in_a_hub_cache_snapshot_is_refused(
    hub: HubStub, store: HfWeightStore, tmp_path: Path
) -> None:
    """A Hugging Face cache snapshot names each blob by its sha256: a flipped byte in a blob is caught."""
    snap = Path(
        snapshot_download("org/tiny", revision=SHA, cache_dir=tmp_path / "cache", endpoint=hub.url, token=False)
    )
    events: list[tuple[str, Any]] = []
    in_place(store, snap, tmp_path, events)
    assert [f["sha256_checked"] for e, f in events if e == "stage_verified"] == [len(FILES)]
    blob = (snap / SHARDS[0]).resolve()
    flip(blob, header_end(blob) + 7)
    with pytest.raises(WeightsError, match=f"{SHARDS[0]} failed its sha256 check"):
        in_place(store, snap, tmp_path)


def test_staging_a_local_copy_checks_the_sha256_its_manifest_records(
    hub: HubStub, store: HfWeightStore, tmp_path: Path
) -> None:
    """Staging from a local directory with a manifest verifies every copied file's sha256: nothing staged."""
    first = store.stage(
        StageRequest(name="tiny", repo="org/tiny", revision=SHA, root=str(tmp_path / "a"), endpoint=hub.url),
        lambda e, f: None,
    )
    shard = Path(first.path) / SHARDS[0]
    flip(shard, header_end(shard) + 3)
    request = StageRequest(
        name="tiny", repo="org/tiny", revision=SHA, root=str(tmp_path / "b"), source=f"local:{first.path}"
    )
    with pytest.raises(WeightsError, match=f"{SHARDS[0]} failed its sha256 check"):
        store.stage(request, lambda e, f: None)
    assert store.verify(str(tmp_path / "b"), "tiny", SHA) is None


def test_a_hub_shard_with_a_corrupt_header_is_not_staged(store: HfWeightStore, tmp_path: Path) -> None:
    """The hub's sha256 matches what it serves, but a shard whose header overruns the file is refused."""
    bad = bytearray(FILES[SHARDS[0]])
    bad[:8] = struct.pack("<Q", len(bad))
    with HubStub() as stub:
        stub.add(StubRepo.of("org/tiny", {**FILES, SHARDS[0]: bytes(bad)}, sha=SHA))
        with pytest.raises(WeightsError, match=f"{SHARDS[0]}: safetensors header length"):
            store.stage(
                StageRequest(name="tiny", repo="org/tiny", revision=SHA, root=str(tmp_path / "m"), endpoint=stub.url),
                lambda e, f: None,
            )
    assert store.verify(str(tmp_path / "m"), "tiny", SHA) is None


def test_a_manifest_in_place_naming_a_file_outside_the_directory_is_refused(
    store: HfWeightStore, tmp_path: Path
) -> None:
    """A manifest whose listing leaves the directory (../) is refused before any file is read."""
    model = write_model(tmp_path / "m")
    (tmp_path / "secret").write_text("not weights")
    (model / ".orchestrator-manifest.json").write_text(
        json.dumps(
            {
                "name": "tiny",
                "repo": "org/tiny",
                "revision": SHA,
                "source": "hub",
                "staged_at": 0,
                "path": str(model),
                "files": {**{n: len(d) for n, d in FILES.items()}, "../secret": 11},
            }
        )
    )
    with pytest.raises(WeightsError, match=r"file name '\.\./secret' .* is not a plain relative path"):
        in_place(store, model, tmp_path)
