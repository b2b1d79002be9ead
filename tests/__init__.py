"""The gateway's tests. Folders hold test modules (``test_*.py``); the modules beside this file
are the helpers they share, with public names (no test module imports another: test_tree.py).

Waiting and reading
    waits.py             wait_until / eventually: a condition with a deadline, never a sleep
    logs.py              the gateway's JSON log lines: log_lines, matching, access_lines,
                         wait_for_line
    anthropic_stream_check.py   check_stream: an Anthropic SSE stream is well formed

Processes
    procs.py             free_port, start_gateway, Proc (stopped by PID), wait_http, post/get,
                         metric, peak_rss_mb
    pg.py                a throwaway PostgreSQL server
    redis_server.py      a throwaway redis-server (stopped and started again on its port)
    fixtures_llama.py    a real llama.cpp upstream serving the tiny model (pytest fixtures)
    fake_dns_gateway.py  the gateway with a resolver a test rewrites

Stubs (upstreams and backends the gateway talks to)
    stub_upstream.py     the scripted OpenAI-compatible upstream (a scenario per model name)
    hostile_upstream.py  a misbehaving upstream at the TCP level
    searxng_stub.py      a SearXNG-compatible search backend
    otlp_collector.py    an OTLP/HTTP collector (protobuf and JSON) in a thread, for telemetry
    cutting_proxy.py     a proxy to a real engine that cuts streams mid-answer
    upstream_wire.py     the upstream client's wire: a fake transport, reply tables, a
                         loopback upstream

Clients and drivers
    hostile_gateway.py   the gateway in front of hostile_upstream.py, and its client
    batch_client.py      Message Batches over raw HTTP
    route_bodies.py      a body per JSON route, hostile bodies, many sent at once
    node.py              the JavaScript clients: the TypeScript SDK, Claude Code
    sdk.py               the official Python SDK, closed after each test
    counters_driver.py   one process taking from the shared counters (run several at once)
    llama_sessions.py    Claude Code-like sessions against several llama.cpp engines

Data
    golden_streams.py    the golden stream cases and their driver
    client_tool_schemas.py   the documented schemas of Anthropic's client tools
    deploy_files.py      deploy/'s files and their readers
    pdfs.py              tiny valid PDFs
    parser_cost.py       costly replies for the parser cost test (run in its own process)
    fuzzing.py           how many examples a fuzz property runs
"""
