"""`POST /v1/score`: protocol, serving and router."""
