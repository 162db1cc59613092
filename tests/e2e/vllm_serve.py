"""`vllm serve` for the CPU build, whose console script is broken: only the serve subcommand (the one
with --headless and the multi-node flags), built on vLLM's own parser (see shared/notes/multinode.md).

Everything runs under the main guard: vLLM spawns workers that re-import the main module.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(description="vLLM serve (CPU build, test launcher)")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    args = parser.parse_args(["serve", *sys.argv[1:]])
    command.validate(args)
    args.dispatch_function(args)
