"""The lab console: a page that streams through the edge while you break hops.

    app.py        create_app(settings): the page, its static files, /healthz
    control.py    the control API under /api: toxics, hops, presets, engine stats
    presets.py    the scenario catalogue as one-click presets (data, no I/O)
    metrics.py    the gateway's /metrics, read into the few figures the page shows
    healthcheck.py  `python -m streamlab.console.healthcheck` (compose's probe)
    static/       index.html, console.js, console.css: no build step

The page streams from the edge itself, like any client (nginx allows the
console's origin, and only it, to read the answers); the console's server
proxies only its own control API, through the same Toxiproxy client and
engine stats the CLI uses. Its settings (`ConsoleSettings`: where it listens and
what it talks to) are in streamlab/lab/console_settings.py, below the lab that
starts it with them. See docs/console.md.
"""
