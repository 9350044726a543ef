"""`python -m attention.teacher_links`: an outside aligner's word links for the alignment
student to learn from. The command lives in alignment/teacher_links.py."""

from alignment.teacher_links import define_flags, main
from common import cli

if __name__ == "__main__":
    define_flags()
    cli.run(main)
