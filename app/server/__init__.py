"""Tandem as a local OpenAI-compatible server: protocol, security and the aiohttp app.

Nothing here imports Qt or runs MLX; the engine is reached only through the
:class:`~app.server.http.Backend` interface, which the Qt layer implements.
"""
