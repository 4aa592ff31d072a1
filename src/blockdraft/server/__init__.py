"""OpenAI-compatible HTTP server (extra: `pip install blockdraft[serve]`), imported lazily."""
