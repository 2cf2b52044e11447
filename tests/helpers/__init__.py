"""What the test suites share, written once: tiny models, the session fixtures (a tiny model saved for real, a
real Redis), test servers (in this process or as a real process), SSE parsing, a gate in the server's work.

Imported as `from tests.helpers.<module> import ...`; the fixtures are registered by tests/conftest.py.
"""
