"""OpenAI-compatible `POST /v1/completions` and `GET /v1/models`: protocol (schemas), serving (the logic: plan,
generation, log-probs, streaming) and router."""
