"""Start the stand-in server from a vLLM command line, as rendered units do.

The unit template renders ``ENGINE --model DIR --served-model-name NAME --host H --port P ...``;
this translates the flags the stand-in needs, takes the GPUs from CUDA_VISIBLE_DEVICES like vLLM
does, passes the stand-in's own behaviour flags (e.g. ``--load-time 2``) through, and execs the
server so that systemd's MainPID is the server itself.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SERVER = Path(__file__).with_name("openai_server.py")


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model")
    p.add_argument("--served-model-name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", default="8000")
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
                 "--max-model-len", "--max-num-seqs", "--gpu-memory-utilization"):
        p.add_argument(flag)
    p.add_argument("--enable-expert-parallel", action="store_true")
    known, rest = p.parse_known_args(argv)
    args = [sys.executable, str(SERVER), "--host", known.host, "--port", str(known.port),
            "--served-name", known.served_model_name or known.model or "model"]
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if gpus and "--gpus" not in rest:
        args += ["--gpus", gpus, "--gpu-mib", os.environ.get("STANDIN_GPU_MIB", "70000")]
    os.execv(sys.executable, [*args, *rest])


if __name__ == "__main__":
    main(sys.argv[1:])
