"""The `boardwalk` command: a client of the HTTP API that never imports Django (usage in
`boardwalk_cli.main`)."""
