"""The soak's 60-second version (docs/soak.md has the 10-minute run): examples/bench/soak.py serves the
tiny Qwen3-Omni with talker by `graphc run` in a process of its own on loopback and runs 64 streaming clients
over every kind it serves (text chat, completions, audio in, image in, speech, chat with audio out), 5% of
them cancelled mid-stream. No request may fail, no KV page may stay held once the server is idle (its
/health), and the server's RSS may not grow more than 20 MiB after warm-up. About 2 minutes on 2 cores.

The checks that decide a stream ended properly are tested here too, on streams broken by hand."""
import json

import pytest

pytest.importorskip("openai")

from examples.bench.soak import check_speech, check_text, main, Outcome  # noqa: E402

CHAT = ['{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}',
        '{"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": null}]}',
        '{"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}',
        '{"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens": 3, "total_tokens": 7}}', "[DONE]"]


def test_the_checks_refuse_broken_streams():
    assert check_text(CHAT, 4, True, Outcome("chat")) is None
    assert check_text(CHAT[:-1], 4, True, Outcome("chat")) == "no [DONE]"                 # cut before [DONE]
    assert check_text(CHAT[:2] + CHAT[3:], 4, True, Outcome("chat")) == "0 finish_reasons"
    assert check_text(CHAT[:3] + CHAT[4:], 4, True, Outcome("chat")) == "no usage chunk"
    assert check_text(CHAT[1:], 4, True, Outcome("chat")) == "no role chunk"
    assert check_text(CHAT, 5, True, Outcome("chat")) == "finish_reason length at 4 of 5 tokens"
    assert check_text(CHAT, 3, True, Outcome("chat")) == "completion_tokens 4 of max_tokens 3"
    err = '{"error": {"message": "boom", "type": "server_error", "param": null, "code": null}}'
    assert check_text(CHAT[:2] + [err] + CHAT[2:], 4, True, Outcome("chat")) == "error event: boom"
    abort = CHAT[2].replace('"length"', '"abort"')
    assert check_text(CHAT[:2] + [abort] + CHAT[3:], 4, True, Outcome("chat")) == "finish_reason abort"
    delta, done = '{"type": "speech.audio.delta", "audio": "AAA="}', '{"type": "speech.audio.done", "usage": ' \
                                                                      '{"output_tokens": 2}}'
    assert check_speech([delta, done], Outcome("speech")) is None
    assert check_speech([delta], Outcome("speech")) == "no speech.audio.done"
    assert check_speech([delta, err], Outcome("speech")) == "error event: boom"


def test_soak_60_seconds(tmp_path, capsys):
    out = tmp_path / "soak.json"
    rc = main(["--seconds", "60", "--every", "30", "--json", str(out)])
    s = json.loads(out.read_text())
    assert rc == 0, capsys.readouterr().out
    q = s["requests"]
    assert q["failed"] == 0 and q["cancelled"] > 0 and q["completed"] > 100
    assert set(s["kinds"]) == {"chat", "completion", "audio_in", "image_in", "speech", "chat_audio"}
    assert all(q["by_kind"][k].get("completed", 0) > 0 for k in s["kinds"])
    assert s["leaked_pages"] == 0 and s["health_after"]["running"] == s["health_after"]["waiting"] == 0
    assert s["rss_mib"]["growth"] <= s["rss_mib"]["bound"] == 20
    assert q["server_finished"].get("abort", 0) > 0          # the cancels reached the server as aborts
