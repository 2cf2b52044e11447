"""Session routes (`/v1/sessions`: create, list, get, delete, fork, snapshots, append, generate, and the history's
versions and rewind): protocol, serving and router."""
