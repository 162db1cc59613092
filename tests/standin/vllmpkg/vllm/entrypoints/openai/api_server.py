"""`python3 -m vllm.entrypoints.openai.api_server ...` on the test hosts: the stand-in server run in this
very process, so that its command line stays vLLM's, as a hand-written unit's or a hand-run engine's does
(what `orchestrator adopt` reads in /proc and in unit files). Flags as vllm_compat.py translates them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # tests/standin: the server and its modules

import openai_server
import vllm_compat

if __name__ == "__main__":
    sys.exit(openai_server.main(vllm_compat.server_args(sys.argv[1:])))
