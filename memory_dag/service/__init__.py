"""`memory-dag serve`: the OpenAI-compatible proxy, the REST API and MCP over one `Memory`.

`app.py` (the FastAPI app, errors, body limit, key check, `serve`), `identity.py` (API keys:
key -> agent and user), `rest.py` (`/v1/memories`, `/v1/query`, `/v1/context`, export),
`proxy.py` (`/v1/chat/completions`, `/v1/models`), `mcp.py` (the MCP tools, HTTP and stdio),
`asgi.py` (the app for any ASGI server).
"""
