"""OpenAI's Conversations API (`/v1/conversations`) on sessions (sessions/conversations.py): protocol, serving
and router."""
