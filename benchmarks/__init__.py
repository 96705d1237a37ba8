"""offload's benchmarks: maintained suites behind one entry point.

    python -m benchmarks                 # list the suites (registry.py): question, command, minutes, output
    python -m benchmarks SUITE [ARGS]    # run one (cli.py): progress on stderr, then its answer table

Layout: `suites/` (the maintained comparisons), `harness/`
(servers, load generators, /proc readers, statistics, reports, the page's
tables and pictures), `compare.py` (the regression check), `tests/` (the
harness's tests and every suite once in smoke mode, in `make test`).
A suite writes into `.benchmarks/runs/SUITE/` (ignored by git): a run never
rewrites tracked files. `results/latest/SUITE/` is the docs' snapshot, changed
only on purpose (`--out benchmarks/results/latest/SUITE`); a finished
experiment lives on as its decision record in docs/decisions/, whose command
and commit rerun it from git.
"""
