"""The ``asyncroll`` command and ``python -m asyncroll …``: the command line of :mod:`asyncroll.cli`.

The CLI's modules import under :func:`asyncroll.cli_signals.starting`: a Ctrl-C (or SIGTERM, SIGHUP) in
that first fraction of a second exits 130 with one line instead of a traceback from inside an import.
A standard descriptor the command was started without is held on ``/dev/null`` first
(:mod:`asyncroll.std_fds`).
"""

from asyncroll import cli_signals
from asyncroll.std_fds import hold_standard_fds


def main() -> None:
    hold_standard_fds()  # before anything opens a file: a closed stderr's number is no output file's
    with cli_signals.starting():
        from asyncroll.cli import main as cli_main
    cli_main()


if __name__ == "__main__":
    main()
