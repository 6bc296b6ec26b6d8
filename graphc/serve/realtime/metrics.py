"""The realtime endpoint's metrics, in the app's registry (/metrics):

  graphc_realtime_sessions_open            sessions open now
  graphc_realtime_sessions_total{outcome}  sessions opened, and refused (the server was full)
  graphc_realtime_vad_seconds_total        time Silero ran, all sessions together
  graphc_realtime_first_audio_seconds      from speech_stopped to the answer's first audio delta
  graphc_realtime_cancelled_total{reason}  responses cancelled: client_cancelled or turn_detected (barge-in)
"""
from __future__ import annotations

from graphc.serve.ops import LATENCY_BUCKETS


class RealtimeMetrics:
    def __init__(self, registry):
        from prometheus_client import Counter, Gauge, Histogram

        self.open = Gauge("graphc_realtime_sessions_open", "realtime sessions open", registry=registry)
        self.sessions = Counter("graphc_realtime_sessions", "realtime sessions opened or refused", ["outcome"],
                                registry=registry)
        self.vad = Counter("graphc_realtime_vad_seconds", "seconds the voice activity model ran", registry=registry)
        self.first = Histogram("graphc_realtime_first_audio_seconds", "speech_stopped to the first audio delta",
                               buckets=LATENCY_BUCKETS, registry=registry)
        self.cancelled = Counter("graphc_realtime_cancelled", "responses cancelled", ["reason"], registry=registry)

    def first_audio(self, seconds: float) -> None:
        self.first.observe(seconds)
