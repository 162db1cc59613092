"""EngineControl over HTTP with httpx: an engine's sleep, wake, is_sleeping and level-2 reload, at the
paths its ``SleepApi`` names.

The engine's own words travel up: every error carries the HTTP status and the body it answered
(an engine's 500 "CUDA Error: out of memory" is what an operator needs to read in history).
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

Params = list[tuple[str, str | int | float | bool | None]]

from orchestrator.engines import ENGINE, Engine
from orchestrator.errors import EngineError
from orchestrator.secrets import redact

MODES = ("wait", "keep", "abort")


class HttpEngineControl:
    """One engine's sleep mode over HTTP (wiring makes one per engine of ``engines.ENGINES``)."""

    def __init__(
        self, engine: Engine = ENGINE, timeout: float = 10.0, sleep_timeout: float = 300.0, wake_timeout: float = 120.0
    ) -> None:
        self._api = engine.sleep_api
        self._completions = engine.completions_path
        # A first level-1 sleep copies the weights to host RAM (12.6 s for 13 GiB measured) and
        # mode=wait waits for running requests too: its own, longer, limit.
        self._client = httpx.Client(timeout=timeout)
        self._sleep_timeout = sleep_timeout
        self._wake_timeout = wake_timeout

    def close(self) -> None:
        self._client.close()

    def _post(
        self,
        base_url: str,
        path: str,
        *,
        params: Params | None = None,
        json: object = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        what = f"POST {base_url}{path}" + ("?" + "&".join(f"{k}={v}" for k, v in params) if params else "")
        try:
            r = self._client.post(
                f"{base_url}{path}",
                params=params,
                json=json,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.HTTPError as exc:
            raise EngineError(f"{what}: no answer ({type(exc).__name__}: {exc})") from exc
        if r.status_code != 200:
            body = redact(r.text)[:500]
            raise EngineError(f"{what}: HTTP {r.status_code}: {body}", status=r.status_code, body=body)
        return r

    def sleep(self, base_url: str, level: int, mode: str = "wait") -> None:
        if level not in (1, 2):
            raise EngineError(f"sleep level {level!r} for {base_url}: must be 1 or 2")
        if mode not in MODES:
            raise EngineError(f"sleep mode {mode!r} for {base_url}: must be one of {', '.join(MODES)}")
        self._post(
            base_url, self._api.sleep, params=[("level", str(level)), ("mode", mode)], timeout=self._sleep_timeout
        )

    def wake(self, base_url: str, tags: Sequence[str] = ()) -> None:
        params: Params = [("tags", t) for t in tags]
        self._post(base_url, self._api.wake, params=params or None, timeout=self._wake_timeout)

    def is_sleeping(self, base_url: str) -> bool:
        try:
            r = self._client.get(f"{base_url}{self._api.is_sleeping}")
        except httpx.HTTPError as exc:
            raise EngineError(
                f"GET {base_url}{self._api.is_sleeping}: no answer ({type(exc).__name__}: {exc})"
            ) from exc
        body = redact(r.text)[:500]
        if r.status_code != 200:
            # 404: the engine runs without its control endpoints (no Engine.dev_mode_env), or is another engine.
            raise EngineError(
                f"GET {base_url}{self._api.is_sleeping}: HTTP {r.status_code}: {body}", status=r.status_code, body=body
            )
        try:
            value = r.json()["is_sleeping"]
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineError(
                f"GET {base_url}{self._api.is_sleeping}: unexpected answer {body!r}", status=200, body=body
            ) from exc
        if not isinstance(value, bool):
            raise EngineError(
                f"GET {base_url}{self._api.is_sleeping}: is_sleeping is {value!r}, not a boolean", status=200, body=body
            )
        return value

    def reload_weights(self, base_url: str) -> None:
        self._post(base_url, self._api.reload_weights, json={"method": "reload_weights"}, timeout=self._wake_timeout)

    def reset_prefix_cache(self, base_url: str) -> None:
        self._post(base_url, self._api.reset_prefix_cache)

    def complete(self, base_url: str, model: str, timeout: float) -> str:
        body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        r = self._post(base_url, self._completions, json=body, timeout=timeout)
        try:
            return str(r.json()["choices"][0]["text"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            text = redact(r.text)[:300]
            raise EngineError(
                f"POST {base_url}{self._completions}: unexpected answer {text!r}", status=200, body=text
            ) from exc
