"""The plugin's errors and the exit codes they map to (documented in ``kubectl grpo --help``)."""

from __future__ import annotations

import sys

from grpo_operator import __version__

EXIT_OK = 0
EXIT_ERROR = 1  # the request reached the cluster but could not be carried out
EXIT_USAGE = 2  # bad arguments (argparse's own code)
EXIT_NOT_FOUND = 3  # no such job, pod, checkpoint or file
EXIT_FORBIDDEN = 4  # the user lacks a permission the command needs
EXIT_BAD_DATA = 5  # a file on the job's volume is malformed or unsafe (a link out of it, a hostile tar)


class PluginError(Exception):
    """An error the user can act on; its message says what was wrong and what to do."""

    exit_code = EXIT_ERROR


class NotFound(PluginError):
    exit_code = EXIT_NOT_FOUND


class Forbidden(PluginError):
    exit_code = EXIT_FORBIDDEN


class BadData(PluginError):
    """What the job's volume holds cannot be used as it is (written by the tenant's trainer image)."""

    exit_code = EXIT_BAD_DATA


def matplotlib_missing(detail: str) -> PluginError:
    """``--plot`` without matplotlib: it is the plugin's `plot` extra, not a dependency (most users never
    draw). Names the pip of the environment the plugin runs in, so the advice fits a pipx or krew install
    as well as a venv."""
    return PluginError(
        f"--plot needs matplotlib, which is not installed here ({detail}): install the plugin's plot extra "
        f"with `{sys.executable} -m pip install 'kubectl-grpo[plot]=={__version__}'` (or "
        "`pipx inject kubectl-grpo matplotlib`), or leave out --plot"
    )
