"""The command-line runner every attnmt command uses: absl flags (config files included)
parsed with one-line user errors, and `main` guarded the same way.

Usage in an entry point:

    _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.")

    def main(argv):
        cfg = resolved.resolve_config(_CONFIG)  # configs/resolved.py; UserError if invalid
        resolved.write_config_json(cfg, workdir)
        ...

    if __name__ == "__main__":
        cli.run(main)   # = app.run(main_guard(main), flags_parser=parse_flags)

Every user error, whether raised while absl parses the flags (unknown config
key, wrong value type, missing or broken config file) or inside `main`
(`UserError`, `DataError`, or an OSError on a user's path: missing, read-only, a
file where a folder should be, a full disk), ends as ONE line on stderr,
`error: <message>`, with exit code 2. `--debug` or ATTNMT_DEBUG=1 shows the
traceback instead. Any other exception is a bug and keeps its traceback.

What absl + ml_collections do on their own: a wrong type prints
"FATAL Flags parsing error: ..." plus a help hint (exit 1); an unknown key
raises AttributeError/KeyError with a full traceback; a missing config file is
not an error at parse time at all, `_CONFIG.value` becomes a placeholder that
raises OSError on first use. `parse_flags` and `resolve_config` fix all three.
"""

import difflib
import errno
import functools
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

import ml_collections
from absl import app, flags

# Not re-exported by the package: is_config_flag, ConfigFileFlagParser, get_type.
from ml_collections.config_flags import config_flags as config_flags_lib
from ml_collections.config_flags import config_path

from common.errors import UserError

DEBUG_ENV = "ATTNMT_DEBUG"
# Exceptions that are the user's doing, reported without a traceback. An OSError is
# the user's too when it names a path (see `user_error_message`).
USER_ERRORS = (UserError,)
# What an OSError on a path means, in words, by errno ({path}: the path as given).
_OS_ERROR_WORDS = {
    errno.ENOENT: "no such file or folder: {path}",
    errno.ENOTDIR: "{path}: a part of this path is a file, not a folder",
    errno.EISDIR: "{path} is a folder, not a file", errno.EEXIST: "{path} already exists",
    errno.EACCES: "permission denied: {path}", errno.EPERM: "permission denied: {path}",
    errno.EROFS: "cannot write {path}: read-only file system",
    errno.ENOSPC: "no space left on device: {path}",
    errno.EDQUOT: "disk quota exceeded: {path}", errno.EFBIG: "file too large: {path}",
    errno.ENAMETOOLONG: "file name too long: {path}",
    errno.ELOOP: "too many levels of symbolic links: {path}",
    errno.EIO: "input/output error (a failing disk or network file system?): {path}",
}

if "debug" not in flags.FLAGS:
    flags.DEFINE_bool("debug", False, "Show full tracebacks for user errors.")


def debug_enabled(argv: Iterable[str] = ()) -> bool:
    """True when tracebacks are wanted: ATTNMT_DEBUG=1, --debug parsed or in argv."""
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        return True
    if "--debug" in argv:
        return True
    return flags.FLAGS.is_parsed() and flags.FLAGS.debug


def fail(message: str, code: int = 2) -> NoReturn:
    """Prints `error: <message>` (one line) on stderr and exits with `code`."""
    line = " ".join(str(message).split("\n")).strip() or "unknown error"
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(code)


def _config_flags() -> list[str]:
    return [name for name in flags.FLAGS if config_flags_lib.is_config_flag(flags.FLAGS[name])]


def _config_path(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}=") or arg.startswith(f"-{name}="):
            return arg.split("=", 1)[1]
        if arg in (f"--{name}", f"-{name}") and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _load_config_for(name: str, argv: list[str]) -> ml_collections.ConfigDict | None:
    """Loads the config file given to flag `name` in argv again, or None."""
    path = _config_path(argv, name)
    if path is None:
        return None
    try:
        config = config_flags_lib.ConfigFileFlagParser(name, lock_config=False).parse(path)
        config.keys()  # A config that failed to load raises here.
    except Exception:  # noqa: BLE001 - the caller falls back to absl's message.
        return None
    return config


def _unknown_key_message(argv: list[str]) -> str | None:
    """Names the first `--config.a.b` override whose path is not in the config."""
    for name in _config_flags():
        config = _load_config_for(name, argv)
        if config is None:
            continue
        for arg in argv:
            match = re.match(rf"-{{1,2}}(no)?{re.escape(name)}\.([^=]+)", arg)
            if not match:
                continue
            node, walked = config, name
            for part in match.group(2).split("."):
                if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                    keys = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
                    close = difflib.get_close_matches(part, keys, n=1)
                    hint = (f"did you mean {walked}.{close[0]}?" if close else
                            f"{walked} has: {', '.join(keys)}" if keys else
                            f"{walked} is not a group")
                    return f"unknown config key {walked}.{part} in {arg.split('=')[0]} ({hint})"
                node, walked = node[part], f"{walked}.{part}"
    return None


def _wrong_type_message(text: str, argv: list[str]) -> str | None:
    """Rewrites absl's "flag --config.a.b=v: <parser error>" as "expected <type>"."""
    for name in _config_flags():
        match = re.match(rf"flag --{re.escape(name)}\.([^=]+)=(.*?): ", text)
        config = _load_config_for(name, argv) if match else None
        if config is None:
            continue
        try:
            field_type = config_path.get_type(match.group(1), config)
        except (AttributeError, KeyError, TypeError):
            return None
        type_name = getattr(field_type, "__name__", str(field_type))
        return (f"--{name}.{match.group(1)}={match.group(2)}: wrong value type, "
                f"expected {type_name}")
    return None


def _flag_error_message(error: Exception, argv: list[str]) -> str:
    """One line describing an exception raised while absl parsed the flags."""
    text = str(error).strip()
    if isinstance(error, (AttributeError, KeyError)):
        return _unknown_key_message(argv) or f"unknown config key: {text.splitlines()[0]}"
    if isinstance(error, SyntaxError):
        return f"config file {error.filename}, line {error.lineno}: {error.msg}"
    if isinstance(error, OSError) and "config file" in text:
        paths = [p for n in _config_flags() if (p := _config_path(argv, n))]
        missing = [p for p in paths if not Path(p.split(":")[0]).is_file()]
        if missing:
            return f"config file not found: {missing[0]}"
        return f"cannot load config file: {text.splitlines()[-1].strip()}"
    if "Error whilst parsing config file" in text:
        # ml_collections puts a traceback in the message; its last line is the cause.
        return f"cannot load config file: {text.splitlines()[-1].strip()}"
    if isinstance(error, flags.IllegalFlagValueError):
        return _wrong_type_message(text, argv) or text.splitlines()[0]
    return text.splitlines()[0] if text else type(error).__name__


def parse_flags(argv: list[str]) -> list[str]:
    """absl `flags_parser` for app.run: parses flags, user errors -> one line, exit 2.

    Args:
      argv: the full command line, program name first.
    Returns:
      The positional arguments left after parsing (what `main` receives).
    """
    try:
        return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001 - every flag error is the user's input.
        if debug_enabled(argv):
            raise
        fail(_flag_error_message(e, argv))


def describe_os_error(error: OSError) -> str:
    """One line in words for an OSError on a path, e.g. "cannot write runs/x/eval/a.json:
    read-only file system" or "runs/x/a/b: a part of this path is a file, not a folder"."""
    path = os.fsdecode(error.filename) if error.filename is not None else "?"
    code = error.errno
    if code == errno.EEXIST and Path(path).exists() and not Path(path).is_dir():
        # attnmt creates files with mkstemp (which retries a taken name), so a path that
        # exists is a folder it wanted to create: a file is in the way.
        return f"{path} is a file, not a folder"
    if error.filename2 is not None:  # rename, link: both paths
        path = f"{path} (to {os.fsdecode(error.filename2)})"
    if code in _OS_ERROR_WORDS:
        return _OS_ERROR_WORDS[code].format(path=path)
    reason = (error.strerror or os.strerror(code) if code is not None else str(error)).lower()
    return f"{path}: {reason}"


def user_error_message(error: BaseException) -> str | None:
    """The one-line message of a user error, or None for a bug (which keeps its traceback).

    User errors: `UserError` (DataError, MapFormatError, ... included); an OSError that
    names a path (the user's input or output: missing, read-only, not a folder, full
    disk), described by `describe_os_error`. An OSError without a path stays a bug.
    """
    if isinstance(error, USER_ERRORS):
        return str(error) or type(error).__name__
    if (isinstance(error, OSError) and error.errno is not None
            and isinstance(error.filename, (str, bytes, os.PathLike))):
        return describe_os_error(error)
    return None


def main_guard(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
    """Decorates an absl `main(argv)`: user errors -> `error: <message>`, exit 2.

    `user_error_message` decides what is the user's error; other exceptions are bugs
    and keep their traceback. Ctrl-C exits with code 130 and one line (the caller
    saves its state before re-raising KeyboardInterrupt).
    """
    @functools.wraps(main)
    def guarded(argv: list[str]) -> Any:
        try:
            return main(argv)
        except KeyboardInterrupt:
            if debug_enabled():
                raise
            fail("interrupted", code=130)
        except Exception as e:  # noqa: BLE001 - sorted by user_error_message, bugs re-raised
            message = user_error_message(e)
            if message is None or debug_enabled():
                raise
            fail(message)

    return guarded


def run(main: Callable[[list[str]], Any]) -> None:
    """`app.run` with one-line user errors, at flag parsing and inside `main`."""
    app.run(main_guard(main), flags_parser=parse_flags)


