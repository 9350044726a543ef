"""User-facing error type shared by the whole package.

Kept free of heavy imports (no jax, no absl) so that any module can raise it.
The command-line entry points turn a `UserError` into one line on stderr,
`error: <message>`, and exit code 2 (see `common.cli.main_guard`); anything
else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input (flags, config, files), not a bug.

    The message must be one line and say what is wrong and where
    (file, line, config key), e.g. "unknown dataset 'foo' (known: multi30k, ...)".
    """
