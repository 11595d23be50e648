"""``python -m asyncroll …``: the same command line as ``asyncroll …``."""

from asyncroll.cli import main

main()
