"""Preloaded memories (`/v1/memories`): protocol, serving and router."""
