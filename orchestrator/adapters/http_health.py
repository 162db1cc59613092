"""HealthProbe over HTTP with httpx: the engine's readiness probes (Engine.health_path, models_path) and one
1-token completion."""

from __future__ import annotations

import httpx

from orchestrator.engines import ENGINE
from orchestrator.errors import HealthCheckFailed
from orchestrator.secrets import redact


class HttpHealthProbe:
    def __init__(self, timeout: float = 5.0, completion_timeout: float = 60.0) -> None:
        # One pooled client: readiness is polled several times a second during a switch.
        self._client = httpx.Client(timeout=timeout)
        self._completion_timeout = completion_timeout

    def close(self) -> None:
        self._client.close()

    def health(self, base_url: str) -> tuple[bool, str]:
        try:
            r = self._client.get(f"{base_url}{ENGINE.health_path}")
        except httpx.HTTPError as exc:
            return False, f"GET {base_url}{ENGINE.health_path}: {type(exc).__name__}"
        return r.status_code == 200, f"GET {base_url}{ENGINE.health_path}: {r.status_code}"

    def models(self, base_url: str) -> list[str]:
        try:
            r = self._client.get(f"{base_url}{ENGINE.models_path}")
            r.raise_for_status()
            data = r.json()["data"]
            return [str(m["id"]) for m in data]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise HealthCheckFailed(f"GET {base_url}{ENGINE.models_path}: {exc}") from exc

    def complete(self, base_url: str, model: str) -> str:
        body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        try:
            r = self._client.post(f"{base_url}{ENGINE.completions_path}", json=body, timeout=self._completion_timeout)
        except httpx.HTTPError as exc:
            raise HealthCheckFailed(f"POST {base_url}{ENGINE.completions_path}: {type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise HealthCheckFailed(
                f"POST {base_url}{ENGINE.completions_path} for {model!r}: HTTP {r.status_code}: {redact(r.text)[:300]}"
            )
        try:
            return str(r.json()["choices"][0]["text"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise HealthCheckFailed(
                f"POST {base_url}{ENGINE.completions_path}: unexpected answer {redact(r.text)[:300]!r}"
            ) from exc
