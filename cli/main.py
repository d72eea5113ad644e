"""The `advisor` command line. Each command lives in its own module; this file only wires them."""

from __future__ import annotations

import typer

from cli import calibrate, ingest, keys, predict, profiles, recommend, serve

app = typer.Typer(
    name="advisor",
    help="Decide, per workload segment, whether speculative decoding pays off on your traffic.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# In the order a user meets them: the verdict, the what-if, the data, calibration, the service.
app.command()(recommend.recommend)
app.command()(predict.predict)
app.command()(ingest.ingest)
app.command()(ingest.imports)
app.command()(ingest.rejects)
app.command(context_settings={"allow_extra_args": True})(calibrate.calibrate)
app.add_typer(calibrate.calibrations_app, name="calibrations")
app.add_typer(profiles.app, name="profiles")
app.command()(serve.serve)
app.add_typer(keys.app, name="keys")


def main() -> None:
    app()
