"""Start the stand-in server from a vLLM command line, as rendered units do.

The unit template renders ``ENGINE --model DIR --served-model-name NAME --host H --port P ...``;
this translates the flags the stand-in needs, takes the GPUs from CUDA_VISIBLE_DEVICES like vLLM
does, passes the stand-in's own behaviour flags (e.g. ``--load-time 2``) through, and execs the
server so that systemd's MainPID is the server itself.

Per-layout behaviour, for `tune` (set in the model's ``env``, so every variant inherits it):
``STANDIN_LAYOUT_DELAY_S="tp2=0.004,tp4=0.001"`` streams each layout at its own speed, and
``STANDIN_REFUSE_LAYOUTS="tp8"`` makes those layouts fail to load with a vLLM-like error line.
``--distributed-executor-backend ray`` runs the stand-in's Ray executor (ray_engine.py) first.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SERVER = Path(__file__).with_name("openai_server.py")


def main(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, str(SERVER), *server_args(argv)])


def server_args(argv: list[str]) -> list[str]:
    """The stand-in server's arguments for a vLLM command line's (after the engine's words)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model")
    p.add_argument("--served-model-name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", default="8000")
    for flag in (
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--data-parallel-size",
        "--max-model-len",
        "--max-num-seqs",
        "--gpu-memory-utilization",
    ):
        p.add_argument(flag)
    p.add_argument("--enable-expert-parallel", action="store_true")
    p.add_argument("--distributed-executor-backend")
    # vLLM's native multi-node flags: every rank serves like rank 0 here (a headless one on its own node).
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port"):
        p.add_argument(flag)
    p.add_argument("--headless", action="store_true")
    known, rest = p.parse_known_args(argv)
    layout = layout_token(known)
    if layout in _listed("STANDIN_REFUSE_LAYOUTS"):
        print(
            f"ValueError: The output_size of gate's and up's weight = 192 is not divisible by weight "
            f"quantization block_n = 128. (stand-in refuses {layout})",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
    delays = dict(item.split("=", 1) for item in _listed("STANDIN_LAYOUT_DELAY_S"))
    if layout in delays and "--chunk-delay" not in rest:
        rest += ["--chunk-delay", delays[layout]]
    args = [
        "--host",
        known.host,
        "--port",
        str(known.port),
        "--served-name",
        known.served_model_name or known.model or "model",
    ]
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if gpus and "--gpus" not in rest:
        args += ["--gpus", gpus, "--gpu-mib", os.environ.get("STANDIN_GPU_MIB", "70000")]
    if known.distributed_executor_backend == "ray":
        args += ray_args(known)
    return [*args, *rest]


def ray_args(known: argparse.Namespace) -> list[str]:
    """Ray mode, like vLLM: the cluster from RAY_ADDRESS, TP x PP workers, rank 0 on this node."""
    address = os.environ.get("RAY_ADDRESS", "")
    if not address:
        print("standin: --distributed-executor-backend ray needs RAY_ADDRESS", file=sys.stderr, flush=True)
        sys.exit(1)
    world = int(known.tensor_parallel_size or 1) * int(known.pipeline_parallel_size or 1)
    return [
        "--ray-address",
        address,
        "--ray-world",
        str(world),
        "--ray-driver-ip",
        os.environ.get("VLLM_HOST_IP", known.host),
    ]


def layout_token(known: argparse.Namespace) -> str:
    """tp4, tp8+ep, tp2+pp2: the same short form as `tune --layouts`."""
    parts = [f"tp{known.tensor_parallel_size or 1}"]
    parts += [
        f"{n}{v}" for n, v in (("pp", known.pipeline_parallel_size), ("dp", known.data_parallel_size)) if v and v != "1"
    ]
    return "+".join(parts + (["ep"] if known.enable_expert_parallel else []))


def _listed(var: str) -> list[str]:
    return [item.strip() for item in os.environ.get(var, "").split(",") if item.strip()]


if __name__ == "__main__":
    main(sys.argv[1:])
