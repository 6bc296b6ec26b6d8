"""WS /v1/realtime: OpenAI's Realtime API (GA and beta dialects) over the engine.

  route.py         the websocket route, its limits and who may open a session
  connection.py    one session: client events in, server events out, the input buffer, VAD, responses
  protocol.py      the two dialects: event names and session fields
  session.py       session settings, session.update's deep merge and validation
  items.py         conversation items on the wire; conversation.py: the items and the prompt they make
  turns.py         a response: an engine request streamed as events, cancelled at once
  transcribe.py    transcription of committed audio
  audio.py         pcm16 and resampling; buffer.py: the input buffer; vad.py: Silero server VAD
  metrics.py       the endpoint's /metrics
"""
