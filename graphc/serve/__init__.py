"""graphc run's OpenAI-compatible HTTP server over one Engine."""
