"""Log collectors: one module per export format, each mapping its rows onto `requests`."""
