"""The CLI's commands, one module per family; ``asyncroll/cli.py`` assembles them into one app.

Each module imports only typer and the standard library at the top: ``asyncroll --help`` stays fast, and
a command imports what it needs when it runs.
"""
