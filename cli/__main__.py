"""`python -m cli` runs the `advisor` command (what the tests call)."""

from cli.main import main

main()
