"""Interactive Chat Completions (`POST /v1/chat/completions`) on the batch workers' engines.

The web tier validates, holds credit and limits, and puts the request on its engine key's
channel (boardwalk.channels); a worker serving that key feeds it to the same engine as its
batch rows, ahead of them, and sends the result (and partial text, when the engine yields it)
back on the request's reply channel. The web process never imports the engine.
"""
