"""The worker started ahead of its attempt: what it builds while it waits, and the server its DDP ranks fork from."""
