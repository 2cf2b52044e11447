"""OpenAI's Responses API (`/v1/responses`) on top of session history: protocol, serving (a turn's input, the
reply and its events) and router."""
