"""`goosedump serve`: an OpenAI-, ollama- and Anthropic-compatible HTTP server over one model.

    goosedump serve MODEL.gguf [--host 127.0.0.1] [--port 8080] [--api-key KEY]

Endpoints: GET /v1/models, POST /v1/chat/completions, POST /v1/completions,
POST /v1/responses, GET /health, GET /metrics; ollama's POST /api/chat,
POST /api/generate, GET /api/tags, POST /api/show, GET /api/ps, GET
/api/version; llama.cpp's /completion, /tokenize, /detokenize,
/apply-template, /props;
OpenAI's /v1/responses/input_tokens; Anthropic's POST /v1/messages and
/v1/messages/count_tokens (see docs/server.md).

How a request flows: the route (app.py) reads the body (schemas.py,
errors.py), the endpoint's module (chat_completions.py, completions.py,
responses.py, ollama.py, anthropic.py, llamacpp.py, tokens.py) maps its fields (params.py,
ollama_params.py, anthropic_params.py), renders the prompt and submits
it to the Engine, whose one worker thread generates for every client in
arrival order; the generation's events reach the event loop through
bridge.py. The tokens of a chat reply go through the reply layer
(goosedump.reply), whose events each endpoint turns into its own shapes,
streamed or whole. metrics.py counts, and checks the API key.
"""
from .app import Server, create_app, serve

__all__ = ["Server", "create_app", "serve"]
