"""What the routes share (dependencies, limits, error shapes, streams, idempotency, the chat template); no module
here imports an endpoint package."""
