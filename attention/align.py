"""`python -m attention.align`: word links of any bitext from a trained run, scored
against gold links when given (SPEC 4.7). The command lives in alignment/command.py;
`align(workdir, sources, targets, ...)` is the Python function behind it."""

from alignment.aligner import align, select  # noqa: F401  (the Python API)
from alignment.command import define_flags, main
from common import cli

if __name__ == "__main__":
    define_flags()
    cli.run(main)
