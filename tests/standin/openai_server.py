#!/usr/bin/env python3
"""Stand-in for a vLLM OpenAI-compatible server with programmable load time and failure modes.

Stdlib only (asyncio and a minimal HTTP/1.1 server with keep-alive and chunked SSE), so it runs
under any Python 3.11 inside test hosts and streams fast enough to benchmark the load generator.

While loading, every path answers 503 (or, with --listen-after-load, the port refuses connections
like real vLLM, which opens its port only once the engine is up). GPU memory is modelled by
``<gpu-state-dir>/<pid>.json`` files that the stand-in nvidia-smi reads; a file whose pid is dead
is stale (memory of a dead process is freed by the driver) and the reader must ignore it.
Sleep mode (sleep_mode.py): with VLLM_SERVER_DEV_MODE=1 the dev routes of vLLM 0.25.1 exist
(/sleep, /wake_up, /is_sleeping, /collective_rpc, /reset_prefix_cache); GET /standin/sleep shows
the requests a sleeping engine holds, for tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs

from sleep_mode import RESIDUE_MIB, Memory, SleepError, SleepMode

PR_SET_NAME = 15
DEFAULT_GPU_DIR = "/run/standin-gpu"
WORDS = (
    "Hello",
    " world",
    ",",
    " this",
    " is",
    " a",
    " stand",
    "-in",
    " model",
    " that",
    " streams",
    " tokens",
    " quickly",
    " for",
    " tests",
    ".",
)
WORDS_JSON = tuple(json.dumps(w).encode() for w in WORDS)
# What a level-2 sleeper answers when woken without reload_weights: its weights are uninitialised.
GARBAGE = ("\u0120\u0120", "!!", "\u010a", "??")
GARBAGE_JSON = tuple(json.dumps(w).encode() for w in GARBAGE)
DEV_ROUTES = {
    "/sleep": "POST",
    "/wake_up": "POST",
    "/is_sleeping": "GET",
    "/collective_rpc": "POST",
    "/reset_prefix_cache": "POST",
}
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-name", required=True, help="model id listed by /v1/models")
    p.add_argument("--load-time", type=float, default=0.0, help="seconds until /health is 200")
    p.add_argument(
        "--load-time-from-start",
        action="store_true",
        help="count --load-time from this process's start (its exec by systemd, the shim's "
        "included), not from the end of its imports: a load that is a fixed sleep, which "
        "the CPU its own start takes on a busy machine does not lengthen",
    )
    p.add_argument(
        "--listen-after-load", action="store_true", help="refuse connections while loading instead of answering 503"
    )
    p.add_argument("--stop-time", type=float, default=0.0, help="seconds SIGTERM handling takes")
    p.add_argument("--health-ok-but-completions-fail", action="store_true")
    p.add_argument("--crash-after", type=float, default=None, help="exit 1 this long after start")
    p.add_argument("--refuse-to-start", action="store_true", help="exit 1 at once")
    p.add_argument("--gpus", default="", help="comma-separated GPU indices to hold memory on")
    p.add_argument("--gpu-mib", type=int, default=1024, help="MiB held per GPU")
    p.add_argument("--gpu-state-dir", default=os.environ.get("STANDIN_GPU_DIR", DEFAULT_GPU_DIR))
    p.add_argument("--engine-child", action="store_true", help="a forked child holds the memory")
    p.add_argument("--child-ignores-sigterm", action="store_true")
    p.add_argument(
        "--child-max-life",
        type=float,
        default=600.0,
        help="the engine child exits by itself after this long, so nothing leaks",
    )
    p.add_argument("--chunk-delay", type=float, default=0.0, help="seconds per streamed token")
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument(
        "--count-prompt",
        choices=["words", "bytes"],
        default="words",
        help="prompt tokens as whitespace-separated words, or one per UTF-8 byte (a byte-level "
        "tokenizer without merges, whose count per word varies with the word)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="refuse (400, vLLM's message) a request whose prompt + max_tokens exceed this",
    )
    p.add_argument(
        "--record-prompts", action="store_true", help="keep every prompt received; GET /standin/prompts lists them"
    )
    p.add_argument(
        "--stream-batch",
        type=int,
        default=1,
        help="with no token delay: tokens per write (1 = one HTTP chunk per token, like vLLM)",
    )
    p.add_argument(
        "--process-name",
        default=None,
        help="name of the process holding memory (default VLLM::EngineCore for the child)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="join this Ray cluster and place --ray-world GPU workers before serving (ray_engine.py)",
    )
    p.add_argument("--ray-world", type=int, default=1, help="ranks (TP x PP) to place on the Ray cluster")
    p.add_argument("--ray-driver-ip", default="", help="this node's address: rank 0 is placed here")
    p.add_argument("--ray-timeout", type=float, default=60.0, help="seconds the placement group may take")
    # Sleep mode (sleep_mode.py): the routes exist only with VLLM_SERVER_DEV_MODE=1, as in vLLM.
    p.add_argument(
        "--enable-sleep-mode", action="store_true", help="vLLM's flag: without it /sleep answers 200 but frees nothing"
    )
    p.add_argument(
        "--sleep-residue-mib",
        type=int,
        default=RESIDUE_MIB,
        help="MiB per GPU a sleeping engine keeps (measured: m8 1,816-1,844, m1 1,238)",
    )
    p.add_argument("--sleep-time", type=float, default=0.35, help="seconds a level-1/2 sleep takes")
    p.add_argument(
        "--first-sleep-time",
        type=float,
        default=None,
        help="seconds the first sleep of this engine takes (measured 6.9-12.6 s for m8)",
    )
    p.add_argument("--wake-time", type=float, default=0.38, help="seconds a wake_up takes")
    p.add_argument(
        "--reload-time", type=float, default=3.04, help="seconds collective_rpc reload_weights takes (level-2 wake)"
    )
    p.add_argument(
        "--sleep-keeps-memory",
        action="store_true",
        help="failure mode: /sleep answers 200 and the memory stays (vllm#47654)",
    )
    return p.parse_args(argv)


# ---- GPU memory files ---------------------------------------------------------------------------


def gpu_file(state_dir: str, pid: int) -> str:
    return os.path.join(state_dir, f"{pid}.json")


def write_gpu_file(state_dir: str, pid: int, name: str, gpus: list[int], mib: int) -> None:
    """Atomic: readers never see a half-written file."""
    os.makedirs(state_dir, exist_ok=True)
    final = gpu_file(state_dir, pid)
    tmp = f"{final}.tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": pid, "name": name, "gpus": gpus, "mib_per_gpu": mib}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)


def remove_gpu_file(state_dir: str, pid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(gpu_file(state_dir, pid))


def set_process_name(name: str) -> None:
    """comm (what ps/top show without -f) is cut to 15 bytes by the kernel."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


# A cold start of vLLM 0.25.1 with an 8B model on an H200 (bench/gpu/, 113 s to ready): when each of
# its phase lines appeared, as a fraction of the load time, who prints it, and the line. The engine's
# memory shows in nvidia-smi with the weights (11.4% of the final figure: 13 GiB + the CUDA context)
# and jumps to all of it when the KV cache is allocated.
PHASES = (
    (0.19, "api", "non-default args: {{'model': '{model}', 'port': {port}}}"),
    (0.56, "engine", "Initializing a V1 LLM engine (v0.25.1) with config: model='{model}'"),
    (0.61, "engine", "Loading weights took {w:.2f} seconds"),
    (0.61, "engine", "Model loading took 13.01 GiB and {ml:.6f} seconds"),
    (0.80, "engine", "torch.compile took {tc:.2f} s in total"),
    (0.81, "engine", "Available KV cache memory: 104.66 GiB"),
    (0.87, "engine", "Graph capturing finished in {gc:.0f} secs, took 0.98 GiB"),
    (0.99, "engine", "init engine (profile, create kv cache, warmup model) took {ie:.2f} s (compilation: {tc:.2f} s)"),
    (1.00, "api", "Starting vLLM server on http://{host}:{port}"),
    (1.00, "api", "Application startup complete."),
)
WEIGHTS_AT, KV_AT, WEIGHTS_SHARE = 0.61, 0.81, 0.114


def phase_line(args: argparse.Namespace, text: str) -> str:
    t = float(args.load_time)
    return text.format(
        model=args.served_name,
        host=args.host,
        port=args.port,
        w=0.018 * t,
        ml=0.040 * t,
        tc=0.178 * t,
        gc=0.053 * t,
        ie=0.379 * t,
    )


def log_phase(who: str, text: str) -> None:
    prefix = f"({'EngineCore' if who == 'engine' else 'APIServer'} pid={os.getpid()})"
    print(f"{prefix} INFO {time.strftime('%m-%d %H:%M:%S')} {text}", file=sys.stderr, flush=True)


def fork_engine_child(args: argparse.Namespace, gpus: list[int]) -> int:
    """Fork before the event loop and the listening socket exist, so an orphan holds no port.

    Like vLLM's API server: a resource-tracker child (it exits once every process holding its pipe
    is gone) and the EngineCore child that holds the GPU memory. Neither follows its parent's death:
    SIGKILL of the API server alone leaves both running, the engine holding its memory (measured)."""
    sys.stdout.flush()
    sys.stderr.flush()
    tracker_r, tracker_w = os.pipe()
    if os.fork() == 0:
        os.close(tracker_w)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            while os.read(tracker_r, 4096):  # EOF once the API server and the engine are gone
                pass
        finally:
            os._exit(0)
    os.close(tracker_r)
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        engine_child_main(args, gpus)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    finally:
        os._exit(code)


def engine_child_main(args: argparse.Namespace, gpus: list[int]) -> None:
    name = args.process_name or "VLLM::EngineCore"
    set_process_name(name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the whole group; parent decides
    if args.child_ignores_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    me = os.getpid()
    started = time.monotonic()
    load = float(args.load_time)

    def at(fraction: float) -> None:
        time.sleep(max(0.0, started + fraction * load - time.monotonic()))

    try:
        if load > 0:
            engine_phases = [(f, text) for f, who, text in PHASES if who == "engine"]
            for fraction, text in engine_phases:
                at(fraction)
                if fraction == WEIGHTS_AT and text.startswith("Loading weights") and gpus:
                    write_gpu_file(args.gpu_state_dir, me, name, gpus, int(args.gpu_mib * WEIGHTS_SHARE))
                if fraction == KV_AT and gpus:
                    write_gpu_file(args.gpu_state_dir, me, name, gpus, args.gpu_mib)
                log_phase("engine", phase_line(args, text))
        elif gpus:
            write_gpu_file(args.gpu_state_dir, me, name, gpus, args.gpu_mib)
        deadline = time.monotonic() + args.child_max_life
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 1.0))
        print(
            f"standin engine child {me}: exiting after --child-max-life {args.child_max_life}s",
            file=sys.stderr,
            flush=True,
        )
    finally:
        remove_gpu_file(args.gpu_state_dir, me)


# ---- HTTP ---------------------------------------------------------------------------------------


class Request:
    __slots__ = ("body", "keep_alive", "method", "path", "query")

    def __init__(self, method: str, path: str, body: bytes, keep_alive: bool, query: str = "") -> None:
        self.method, self.path, self.body, self.keep_alive = method, path, body, keep_alive
        self.query = query

    def param(self, name: str) -> list[str]:
        return parse_qs(self.query, keep_blank_values=True).get(name, [])


def response_head(status: int, ctype: str, keep_alive: bool, length: int | None) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", f"content-type: {ctype}"]
    lines.append(f"content-length: {length}" if length is not None else "transfer-encoding: chunked")
    if length is None:
        lines.append("cache-control: no-cache")
    if not keep_alive:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def send_json(writer: asyncio.StreamWriter, req: Request, status: int, obj: Any) -> None:
    body = json.dumps(obj).encode()
    writer.write(response_head(status, "application/json", req.keep_alive, len(body)) + body)


def send_empty(writer: asyncio.StreamWriter, req: Request) -> None:
    """Starlette's ``Response(status_code=200)``: no content type, no body."""
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n" + (b"" if req.keep_alive else b"connection: close\r\n") + b"\r\n"
    )


def error_body(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def process_start() -> float:
    """When this process started, on time.monotonic's clock (/proc's start time is since boot)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
    return time.monotonic() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))


class App:
    def __init__(
        self, args: argparse.Namespace, placed: list[dict[str, Any]] | None = None, sleep: SleepMode | None = None
    ) -> None:
        self.args = args
        self.placed = placed  # Ray mode: where each rank's worker runs
        self.started = process_start() if args.load_time_from_start else time.monotonic()
        self.created = int(time.time())
        self.name = args.served_name
        self.prompts: list[str] = []
        self.sleep = sleep or sleep_mode(args, None, os.getpid)
        self.dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE", "0").strip() not in ("", "0")

    def loaded(self) -> bool:
        return time.monotonic() - self.started >= float(self.args.load_time)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, version = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                path, _, query = target.partition("?")
                req = Request(method, path, body, keep, query)
                await self.dispatch(req, writer)
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass  # client went away or sent garbage: drop the connection
        finally:
            writer.close()

    async def dispatch(self, req: Request, writer: asyncio.StreamWriter) -> None:
        if not self.loaded():
            send_json(writer, req, 503, error_body(503, "ServiceUnavailable", "model is loading"))
            return
        if req.path == "/health":
            writer.write(response_head(200, "text/plain", req.keep_alive, 0))
        elif req.path == "/standin/prompts" and self.args.record_prompts:
            send_json(writer, req, 200, {"prompts": self.prompts})
        elif req.path == "/standin/sleep":  # for tests: requests held by a sleeping engine
            sm = self.sleep
            send_json(
                writer,
                req,
                200,
                {
                    "held": sm.held,
                    "running": sm.inflight,
                    "held_mib": sm.held_mib,
                    "wedged": sm.wedged,
                    "sleeping_tags": sorted(sm.sleeping_tags),
                },
            )
        elif req.path == "/standin/ray" and self.placed is not None:
            send_json(writer, req, 200, {"workers": self.placed})
        elif req.path == "/v1/models" and req.method == "GET":
            send_json(
                writer,
                req,
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.name,
                            "object": "model",
                            "created": self.created,
                            "owned_by": "vllm",
                            "root": self.name,
                            "parent": None,
                            "max_model_len": 4096,
                            "permission": [],
                        }
                    ],
                },
            )
        elif req.path in ("/v1/completions", "/v1/chat/completions") and req.method == "POST":
            await self.completion(req, writer, chat=req.path.endswith("chat/completions"))
        elif self.dev_mode and req.path in DEV_ROUTES:
            if req.method != DEV_ROUTES[req.path]:
                send_json(writer, req, 405, {"detail": "Method Not Allowed"})
            else:
                await self.dev(req, writer)
        else:
            send_json(writer, req, 404, error_body(404, "NotFoundError", f"no route {req.path}"))

    async def dev(self, req: Request, writer: asyncio.StreamWriter) -> None:
        """vLLM's dev routes (serve/dev/{sleep,rpc,cache}/api_router.py); engine errors answer 500."""
        sm = self.sleep
        try:
            if req.path == "/is_sleeping":
                body = json.dumps({"is_sleeping": sm.is_sleeping()}, separators=(",", ":")).encode()
                writer.write(response_head(200, "application/json", req.keep_alive, len(body)) + body)
                return
            if req.path == "/sleep":
                level = int((req.param("level") or ["1"])[0])
                await sm.sleep(level, (req.param("mode") or ["abort"])[0])
            elif req.path == "/wake_up":
                await sm.wake_up(req.param("tags") or None)
            elif req.path == "/collective_rpc":
                await self.collective_rpc(req, writer)
                return
            send_empty(writer, req)
        except SleepError as exc:
            log_phase("engine", f"ERROR {exc}")
            send_json(writer, req, 500, error_body(500, "InternalServerError", str(exc)))
        except ValueError:  # int("x"): FastAPI's bare 500
            writer.write(response_head(500, "text/plain; charset=utf-8", req.keep_alive, 21) + b"Internal Server Error")

    async def collective_rpc(self, req: Request, writer: asyncio.StreamWriter) -> None:
        """reload_weights is the one worker method the stand-in has; others fail in the worker."""
        try:
            body = json.loads(req.body or b"null")
        except ValueError as exc:
            send_json(writer, req, 400, {"detail": f"JSON decode error: {exc}"})
            return
        method = body.get("method") if isinstance(body, dict) else None
        if method is None:
            send_json(writer, req, 400, {"detail": "Missing 'method' in request body"})
            return
        if method != "reload_weights":
            raise SleepError(
                f"Call to collective_rpc method failed: 'Worker' object has no attribute "
                f"'{method}' (stand-in: only reload_weights)"
            )
        await self.sleep.reload_weights()
        body_out = b'{"results":[null]}'
        writer.write(response_head(200, "application/json", req.keep_alive, len(body_out)) + body_out)

    async def completion(self, req: Request, writer: asyncio.StreamWriter, *, chat: bool) -> None:
        try:
            body = json.loads(req.body)
            if not isinstance(body, dict):
                raise TypeError("body is not a JSON object")
            n, prompt_tokens = self.validate(body, chat)
        except (TypeError, ValueError) as exc:
            send_json(writer, req, 400, error_body(400, "BadRequestError", str(exc)))
            return
        if body.get("model") != self.name:
            send_json(
                writer, req, 404, error_body(404, "NotFoundError", f"The model `{body.get('model')}` does not exist.")
            )
            return
        if self.args.health_ok_but_completions_fail:
            send_json(
                writer,
                req,
                500,
                error_body(500, "InternalServerError", "EngineCore encountered an issue (stand-in failure mode)"),
            )
            return
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        epoch = await self.sleep.admit()  # held while the engine sleeps, as vLLM queues it
        try:
            if body.get("stream"):
                opts = body.get("stream_options") or {}
                await self.stream(writer, req, rid, chat, n, prompt_tokens, epoch, bool(opts.get("include_usage")))
            else:
                await self.whole(writer, req, rid, chat, n, prompt_tokens, epoch)
        finally:
            self.sleep.done()

    async def whole(
        self, writer: asyncio.StreamWriter, req: Request, rid: str, chat: bool, n: int, prompt_tokens: int, epoch: int
    ) -> None:
        sm, delay, produced = self.sleep, self.args.chunk_delay, 0
        words = WORDS if sm.weights_valid else GARBAGE
        while produced < n:
            if not (sm.running.is_set() and epoch == sm.abort_epoch) and not await sm.step(epoch):
                break
            if delay:
                await asyncio.sleep(delay)
            produced += 1
        finish = "length" if produced == n else "abort"
        text = "".join(words[i % len(words)] for i in range(produced))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": produced,
            "total_tokens": prompt_tokens + produced,
        }
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        send_json(
            writer,
            req,
            200,
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.name,
                "choices": [choice],
                "usage": usage,
            },
        )

    def validate(self, body: dict[str, Any], chat: bool) -> tuple[int, int]:
        """(max tokens, prompt tokens); prompt tokens are counted as words, roughly like BPE."""
        n = body.get("max_completion_tokens") if chat else None
        n = body.get("max_tokens") if n is None else n
        n = self.args.default_max_tokens if n is None else n
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {n!r}")
        count = (
            (lambda text: len(text.encode())) if self.args.count_prompt == "bytes" else (lambda text: len(text.split()))
        )
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ValueError("messages must be a non-empty list")
            texts = [str(m.get("content", "")) for m in msgs if isinstance(m, dict)]
            words = sum(count(t) + 4 for t in texts)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                texts = [prompt]
                words = count(prompt)
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                texts = []
                words = len(prompt)
            elif isinstance(prompt, list) and prompt:
                texts = [str(p) for p in prompt]
                words = sum(count(t) for t in texts)
            else:
                raise ValueError("prompt must be a string, a list of strings or of token ids")
        if self.args.record_prompts and len(self.prompts) < 100_000:
            self.prompts.extend(texts)
        limit = self.args.max_model_len
        if limit is not None and words + n > limit:
            raise ValueError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{words + n} tokens ({words} in the messages, {n} in the completion)."
            )
        return n, max(1, words)

    async def stream(
        self,
        writer: asyncio.StreamWriter,
        req: Request,
        rid: str,
        chat: bool,
        n: int,
        prompt_tokens: int,
        epoch: int,
        include_usage: bool,
    ) -> None:
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        common = f'{{"id":"{rid}","object":"{obj}","created":{created},"model":{json.dumps(self.name)},'
        pre = (common + '"choices":[{"index":0,' + ('"delta":{"content":' if chat else '"text":')).encode()
        close = b"}" if chat else b""
        stop_reason = b"" if chat else b',"stop_reason":null'
        mid = b',"logprobs":null,"finish_reason":null' + stop_reason + b"}]}"
        last = b',"logprobs":null,"finish_reason":"length"' + stop_reason + b"}]}"
        aborted = b',"logprobs":null,"finish_reason":"abort"' + stop_reason + b"}]}"
        sm = self.sleep
        words = WORDS_JSON if sm.weights_valid else GARBAGE_JSON
        writer.write(response_head(200, "text/event-stream", req.keep_alive, None))
        events: list[bytes] = []
        if chat:
            events.append(
                b"data: " + common.encode() + b'"choices":[{"index":0,"delta":{"role":"assistant",'
                b'"content":""},"logprobs":null,"finish_reason":null}]}\n\n'
            )
        delay = self.args.chunk_delay
        produced = 0
        for i in range(n):
            # A sleep with mode=abort ends the stream (HTTP 200, finish_reason "abort"); keep freezes it.
            if not (sm.running.is_set() and epoch == sm.abort_epoch) and not await sm.step(epoch):
                events.append(b"data: " + pre + b'""' + close + aborted + b"\n\n")
                break
            events.append(b"data: " + pre + words[i % len(words)] + close + (last if i == n - 1 else mid) + b"\n\n")
            produced += 1
            if delay:
                await asyncio.sleep(delay)
            if delay or len(events) >= self.args.stream_batch:
                writer.write(chunk(b"".join(events)))
                events.clear()
                await writer.drain()
                if not delay:
                    await asyncio.sleep(0)  # let other streams progress
        if include_usage:
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": produced,
                "total_tokens": prompt_tokens + produced,
            }
            events.append(
                b"data: " + common.encode() + b'"choices":[],"usage":' + json.dumps(usage).encode() + b"}\n\n"
            )
        events.append(b"data: [DONE]\n\n")
        writer.write(chunk(b"".join(events)) + b"0\r\n\r\n")


# ---- lifecycle ----------------------------------------------------------------------------------


def sleep_mode(args: argparse.Namespace, gpus: list[int] | None, holder: Any, child: bool = False) -> SleepMode:
    """The engine's sleep state; it rewrites the holder's GPU file (the EngineCore child's, if any)."""
    name = args.process_name or ("VLLM::EngineCore" if child else sys.executable)
    memory = None
    if gpus:
        memory = Memory(
            args.gpu_state_dir, gpus, lambda mib: write_gpu_file(args.gpu_state_dir, holder(), name, gpus, mib)
        )
    return SleepMode(
        enabled=args.enable_sleep_mode,
        full_mib=args.gpu_mib,
        weights_mib=int(args.gpu_mib * WEIGHTS_SHARE),
        residue_mib=min(args.sleep_residue_mib, args.gpu_mib),
        sleep_time=args.sleep_time,
        first_sleep_time=args.first_sleep_time,
        wake_time=args.wake_time,
        reload_time=args.reload_time,
        keeps_memory=args.sleep_keeps_memory,
        memory=memory,
        holder=holder,
        log=lambda text: log_phase("engine", text),
    )


async def serve(
    args: argparse.Namespace, gpus: list[int], child: int | None, placed: list[dict[str, Any]] | None = None
) -> int:
    loop = asyncio.get_running_loop()
    holder = child if child is not None else os.getpid()
    app = App(args, placed, sleep_mode(args, gpus, lambda: holder, child is not None))
    stop = asyncio.Event()
    outcome = {"code": 0}
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    me = os.getpid()
    holds_memory = bool(gpus) and child is None
    if holds_memory:  # like vLLM, memory is taken as soon as loading starts
        write_gpu_file(args.gpu_state_dir, me, args.process_name or sys.executable, gpus, args.gpu_mib)

    def crash() -> None:
        print(f"standin: crashing after --crash-after {args.crash_after}s", file=sys.stderr, flush=True)
        if holds_memory:
            remove_gpu_file(args.gpu_state_dir, me)  # a dead process's memory is freed by the driver
        os._exit(1)

    def reap() -> None:
        if child is None:
            return
        with contextlib.suppress(ChildProcessError):
            pid, status = os.waitpid(child, os.WNOHANG)
            if pid == child and not stop.is_set():
                remove_gpu_file(args.gpu_state_dir, child)
                print(f"standin: engine child {child} died (status {status}); exiting", file=sys.stderr, flush=True)
                outcome["code"] = 1
                stop.set()

    if args.crash_after is not None:
        loop.call_later(args.crash_after, crash)
    if float(args.load_time) > 0:
        for fraction, who, text in PHASES:
            if who == "api" or child is None:  # without an engine child, this process logs its lines
                loop.call_later(fraction * float(args.load_time), log_phase, who, phase_line(args, text))
    if child is not None:
        loop.add_signal_handler(signal.SIGCHLD, reap)
        reap()  # it may have died before the handler existed
    server = None
    if args.listen_after_load:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=args.load_time)
    if not stop.is_set():
        server = await asyncio.start_server(app.handle, args.host, args.port, backlog=2048, reuse_address=True)
        host, port = server.sockets[0].getsockname()[:2]  # --port 0 picks a free port
        print(
            f"standin: {args.served_name} listening on {host}:{port} (load time {args.load_time}s)",
            file=sys.stderr,
            flush=True,
        )
    await stop.wait()
    if server is not None:
        server.close()  # stop accepting; open streams may go on during the stop time
    await asyncio.sleep(args.stop_time)
    if child is not None and outcome["code"] == 0:
        loop.remove_signal_handler(signal.SIGCHLD)
        await stop_child(child, args.child_ignores_sigterm)
    if holds_memory:
        remove_gpu_file(args.gpu_state_dir, me)
    return outcome["code"]


async def stop_child(child: int, ignores: bool) -> None:
    """SIGTERM the engine; one that ignores it is left behind as an orphan, as vLLM's can be."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGTERM)
    deadline = time.monotonic() + (0.5 if ignores else 10.0)
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            pid, _ = os.waitpid(child, os.WNOHANG)  # noqa: ASYNC222 (WNOHANG never blocks)
            if pid == 0:
                await asyncio.sleep(0.02)
                continue
        return


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.refuse_to_start:
        print(f"standin: {args.served_name} refuses to start (--refuse-to-start)", file=sys.stderr)
        return 1
    try:
        gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    except ValueError:
        print(f"standin: --gpus must be comma-separated integers, got {args.gpus!r}", file=sys.stderr)
        return 2
    if args.process_name and not args.engine_child:
        set_process_name(args.process_name)
    placed = None
    if args.ray_address:
        placed = join_ray(args)
        if placed is None:
            return 1
    child = fork_engine_child(args, gpus) if args.engine_child else None
    return asyncio.run(serve(args, gpus, child, placed))


def join_ray(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """Ray mode: the workers placed on the cluster before the port opens (like vLLM); None on failure."""
    from ray_engine import PlacementError, place  # needs ray: only in Ray mode

    print(
        f"standin: joining Ray at {args.ray_address} to place {args.ray_world} GPU worker(s)",
        file=sys.stderr,
        flush=True,
    )
    try:
        placed = place(args.ray_address, args.ray_world, args.ray_driver_ip, args.ray_timeout)
    except PlacementError as exc:
        print(f"standin: Ray executor failed: {exc}", file=sys.stderr, flush=True)
        return None
    where = ", ".join(f"rank {w['rank']} on {w['ip']} (GPU {','.join(w['gpu_ids'])})" for w in placed)
    print(f"standin: Ray workers placed: {where}", file=sys.stderr, flush=True)
    return placed


if __name__ == "__main__":
    sys.exit(main())
