"""The realtime endpoint's metrics, in the app's registry (/metrics):

  graphc_realtime_sessions_open            sessions open now
  graphc_realtime_sessions_total{outcome}  sessions opened, and refused (the server was full)
  graphc_realtime_vad_seconds_total        time Silero ran, all sessions together
  graphc_realtime_first_audio_seconds      from speech_stopped to the answer's first audio delta
  graphc_realtime_first_audio_phase_seconds{phase}
                                           from speech_stopped to each step of the way there (PHASES: the
                                           engine's request times, then the delta sent)
  graphc_realtime_cancelled_total{reason}  responses cancelled: client_cancelled or turn_detected (barge-in)
"""
from __future__ import annotations

from graphc.serve.ops import LATENCY_BUCKETS

# phase -> the engine request's time it ends at (Request.times): prepared (committed, rendered, media
# preprocessed, admitted to the engine), its first text token, the follow stage's prompt, its first frame, the first
# audio chunk; "sent" is the delta's own time
PHASES = {"prepared": "arrived", "first_token": "first_token", "follow_prompt": "follow_prompt",
          "first_frame": "first_frame", "first_audio": "first_audio"}


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

        self.phase = Histogram("graphc_realtime_first_audio_phase_seconds", "speech_stopped to each step toward "
                               "the first audio delta", ["phase"], buckets=LATENCY_BUCKETS, registry=registry)

    def first_audio(self, since: float, now: float, times: dict) -> None:
        """A response's first audio delta at `now`, its speech_stopped at `since`; times: its request's."""
        self.first.observe(now - since)
        for phase, key in PHASES.items():
            if key in times:
                self.phase.labels(phase).observe(times[key] - since)
        self.phase.labels("sent").observe(now - since)
