"""Bounds on what is read whole from a user's files: a prompt, schema or
grammar file (run's -f, -j, --grammar) and a conversation (the chat's /load)."""

MAX_FLAG_FILE = 64 << 20   # bytes: far past any context's text
