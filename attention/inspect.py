"""`python -m attention.inspect`: heatmaps, the HTML viewer and word links of saved
attention map files (README, journey 3). The command lives in analysis/inspect.py."""

from analysis.inspect import define_flags, main, run  # noqa: F401  (run: the Python API)
from common import cli

if __name__ == "__main__":
    define_flags()
    cli.run(main)
