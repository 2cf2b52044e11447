"""What an operator sees of each request: its id, its trace, and log lines a machine can read.

    context.py   the request being served (its id, tenant, session, trace), wherever its code runs
    tracing.py   the OpenTelemetry SDK, configured by its standard environment variables; off without an endpoint
    spans.py     the one-line calls the request path makes into its trace (a no-op when it is not traced)
    observer.py  the session observer that tells a request's trace what the metrics' hooks see
    logs.py      text or JSON log lines, uvicorn's included

The HTTP layer gives each request its context and server span (api/request_ids.py); docs/deploy.md ("Traces
and logs") says what each span means.
"""
