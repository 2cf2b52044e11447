"""Liveness, readiness, what serves (`/v1/system`) and Prometheus metrics: protocol, serving and router."""
