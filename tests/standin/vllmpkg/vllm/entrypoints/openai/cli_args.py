"""The options of vLLM's API server that the product renders (vllm.entrypoints.openai.cli_args' entry point)."""

from __future__ import annotations

import argparse

FLAGS = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--data-parallel-size",
    "--max-model-len",
    "--max-num-seqs",
    "--gpu-memory-utilization",
)


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for flag in FLAGS:
        parser.add_argument(flag)
    for flag in ("--enable-expert-parallel", "--enable-sleep-mode"):
        parser.add_argument(flag, action="store_true")
    return parser
