"""`solo bench --load`: replay a workload file against `solo serve` on loopback and report latency vs load.

    solo bench --load chat                       # a shipped workload, against a server it starts
    solo bench --load my.toml --url http://127.0.0.1:8000 --rates 0.5x,1x,2x --plot load.png

Modules: workload.py (the file format, prompts, the arrival schedule), client.py (one request, timed by
the client), runner.py (server start, capacity, phases, references, RSS), report.py (percentiles,
goodput, Markdown, plot). The format is documented in workloads/README.md.
"""
