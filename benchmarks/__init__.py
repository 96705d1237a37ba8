"""offload's benchmarks: maintained suites behind one entry point.

    python -m benchmarks                 # list the suites (registry.py): question, command, minutes, output
    python -m benchmarks SUITE [ARGS]    # run one (cli.py): progress on stderr, then its answer table

Layout: `suites/` (the maintained comparisons), `calibration/` (runs that
derive a default or a cost constant), `tools/` (profilers), `harness/`
(servers, load generators, /proc readers, statistics, reports, the page's
tables and pictures), `compare.py` (the regression check), `tests/` (the
harness's tests and every suite once in smoke mode, in `make test`).
A suite writes into `results/latest/SUITE/`, the one current result the docs
are made from; older runs live in git history, and the experiments that
decided a default are recorded in docs/decisions/.
"""
