"""txl_server: a stateful Transformer-XL inference server (engine, sessions, HTTP API)."""

__version__ = "0.1.0"
