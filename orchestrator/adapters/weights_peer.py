"""Agent side of fleet staging: this box stages a model from a peer box named by the controller.

A controller's rollout tells each box which peer already holds the weights (address, port, user,
models dir, and the paths of the key and known_hosts on this box). The box copies with rsync over
SSH (worker/sources.py) exactly as a ``host:NAME`` source of its own deploy.toml would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from orchestrator.adapters.weights import SpecWeights
from orchestrator.core.catalog import Host
from orchestrator.errors import UsageError
from orchestrator.ports import WeightStore

# request key -> catalog Host field (the Host model validates each value, as in deploy.toml)
_FIELDS = {
    "name": "name",
    "address": "address",
    "port": "ssh_port",
    "user": "ssh_user",
    "root": "models_dir",
    "key_file": "ssh_key",
    "known_hosts": "known_hosts",
}


def peer_host(peer: Mapping[str, Any]) -> Host:
    unknown = set(peer) - set(_FIELDS)
    if unknown or "name" not in peer or "address" not in peer:
        raise UsageError(
            f"stage: peer needs name and address, known keys {', '.join(sorted(_FIELDS))} (got {sorted(peer)})"
        )
    try:
        return Host.model_validate({_FIELDS[k]: v for k, v in peer.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"stage: peer {where}: {err['msg']} (got {err.get('input')!r})") from None


def with_peer(weights: WeightStore | None, peer: Mapping[str, Any]) -> tuple[SpecWeights, str]:
    """This box's weight store that also knows the peer; and the ``host:NAME`` source to stage from."""
    if not isinstance(weights, SpecWeights):
        raise UsageError("stage from a peer needs this host's weight store")
    host = peer_host(peer)
    if host.name == weights.host.name:
        raise UsageError(f"stage: peer {host.name!r} is this host itself")
    store = SpecWeights(
        weights.store,
        weights.host,
        weights.token_file,
        fleet={**weights.fleet, host.name: host},
        keep_revisions=weights.keep_revisions,
    )
    return store, f"host:{host.name}"
