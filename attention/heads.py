"""`python -m attention.heads`: importance, pruning curve and roles of every head of a
trained run (SPEC 4.8). The command lives in analysis/heads.py."""

from analysis.heads import analyze_heads, define_flags, main  # noqa: F401  (the Python API)
from common import cli

if __name__ == "__main__":
    define_flags()
    cli.run(main)
