"""The `advisor` command: a thin Typer layer over advisor/, collectors/ and calibration/."""
