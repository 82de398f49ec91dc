"""The wiring: settings, URLs, the web server, the worker runtime and the commands that
assemble every app. Nothing below imports it."""
