"""OpenAI-compatible `POST /v1/chat/completions`, when the operator configures a chat template: protocol, serving
(a chat written out with the template and completed as `/v1/completions` completes) and router."""
