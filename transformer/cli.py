"""The command lines' errors in one line, the config-file flag's (`--config FILE --config.a.b=v`) included."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

from absl import flags

from transformer.run.config_files import check_config, closest_field, leaf_fields, load_config_file


def config_flags_parser(default_config: str) -> Callable[[list[str]], list[str]]:
    """absl's flags parser with a one-line error (exit 2) for a missing or broken config file or an
    unknown or ill-typed --config.* override (naming the closest field); no --config: `default_config`."""

    def parse(argv: list[str]) -> list[str]:
        path = config_path(argv)
        if path is None:  # no --config: the default, as if it had been given
            path = default_config
            argv = [argv[0], f"--config={default_config}", *argv[1:]]
        if not os.path.isfile(path):
            root = os.path.dirname(os.path.dirname(default_config))  # configs/ sits in the repository
            hint = f" (it is in the repository: pass {os.path.join(root, path)})" if os.path.isfile(
                os.path.join(root, path)) else ""
            exit_usage(f"--config {path!r}: no such file (looked from {os.getcwd()}){hint}")
        try:
            rest = flags.FLAGS(argv)
        except Exception as e:  # flags.Error, AttributeError, KeyError, ValueError, ...
            exit_usage(explain_flag_error(path, argv, e))
        try:  # ml_collections takes any get_config() result, e.g. a dict
            check_config(flags.FLAGS["config"].value, path)
        except ValueError as e:
            exit_usage(str(e))
        return rest

    return parse


def exit_usage(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def config_path(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def explain_flag_error(path: str, argv: list[str], error: Exception) -> str:
    """What went wrong on the command line, in one sentence with the fix."""
    try:
        config = load_config_file(path)
    except Exception as e:  # the config file itself is broken
        return f"the config file {path!r} failed to load: {type(e).__name__}: {e}"
    try:
        fields = leaf_fields(check_config(config, path))
    except ValueError as e:
        return str(e)
    for arg in argv[1:]:
        if arg.startswith("--config."):
            name = arg[len("--config."):].split("=", 1)[0]
            if name not in fields:
                close = closest_field(name, fields)
                hint = f"; did you mean config.{close}?" if close else "; configs/common.py lists the fields"
                return f"unknown config field config.{name}{hint}"
    message = str(error).strip()
    return message.splitlines()[0] if message else type(error).__name__


TRACEBACK = "TRANSFORMER_TRACEBACK"  # =1: an error the command lines report in one line raises instead


# Storage full or read-only: nothing is wrong with the run, and the same command resumes it.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def exit_on_storage_error(e: OSError) -> None:
    """In an `except OSError`: one line for full or read-only storage; any other OSError is raised again."""
    if e.errno not in STORAGE_ERRNOS:
        raise e
    where = f" writing {e.filename}" if e.filename else ""
    exit_with_error(ValueError(
        f"{e.strerror}{where}: free space on that disk (or give the run a folder on another one: --workdir, "
        "--config.data.cache_dir) and rerun the same command; it resumes from the last complete checkpoint"))


def exit_with_error(error: Exception, code: int = 1) -> None:
    """'error: <message>' on stderr and exit `code` (TRANSFORMER_TRACEBACK=1: the traceback instead)."""
    if os.environ.get(TRACEBACK, "") not in ("", "0"):
        raise error
    print(f"error: {error}", file=sys.stderr)
    sys.exit(code)


def out_of_memory(error: Exception, config) -> Exception:
    """The one-line error for XLA's RESOURCE_EXHAUSTED (`setup.out_of_memory`); `error` otherwise."""
    if "RESOURCE_EXHAUSTED" not in str(error):
        raise error
    from transformer.training.setup import out_of_memory  # the sampler's command line loads no training code

    return out_of_memory(str(error).splitlines()[0][:160], config)
