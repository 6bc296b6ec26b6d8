"""A two-device plan against HF (issue 12): the tiny Qwen3-Omni that test_engine.py writes with HF
(save_pretrained, random weights), planned for two CPU devices (the thinker on 1, the encoders on 0) and
served by two processes: greedy t2t, a2t and i2t token ids, alone and mixed, equal HF's generate (fp32).
A module of its own: one process drives one multi-device plan at a time."""
import pytest

from graphc.cli import main
from graphc.runtime.engine import Engine
from examples.make_tiny_checkpoint import build_tokenizer, omni_model, save
from tests.parity.test_engine import files, hf_omni, omni_cases, omni_messages, run  # noqa: F401  (files: fixture)
from tests.parity.weights import randomize

PINS = ["nodes.thinker.device=1", "nodes.audio_encoder.device=0", "nodes.vision_encoder.device=0"]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    tok = build_tokenizer()
    hf = omni_model(tok)
    randomize(hf, seed=1)
    path = tmp_path_factory.mktemp("omni2")
    save(hf, tok, path / "ckpt")
    sets = [x for p in PINS for x in ("--set", p)]
    assert main(["plan", "models/qwen3_omni.py", "--preset", "tiny", "--checkpoint", str(path / "ckpt"), "--gpu",
                 "cpu", "--gpus", "2", *sets, "-o", str(path / "p.plan"), "-q"]) == 0
    # every request's media encoded on the worker: the prefix cache would skip an image or clip seen before
    engine = Engine(path / "p.plan", checkpoint=path / "ckpt", prefix_cache=False)
    yield hf, tok, engine
    engine.close()


def test_two_devices_t2t_a2t_i2t_alone_and_mixed_equal_hf(two, files):  # noqa: F811
    hf, tok, engine = two
    assert engine.workers is not None and set(engine.boot.nodes) == {"thinker"}
    cases = {k: c for k, c in omni_cases(files).items() if k in ("t2t", "a2t", "i2t")}
    want = {k: hf_omni(hf, tok, engine, *c) for k, c in cases.items()}
    for k, c in cases.items():
        assert run(engine, [omni_messages(*c)])[0] == want[k], k
    kinds = ["t2t", "a2t", "i2t", "a2t", "i2t", "t2t"]
    got = run(engine, [omni_messages(*cases[k]) for k in kinds], arrivals=[0, 0, 0, 1, 2, 2])
    assert got == [want[k] for k in kinds]
    # the first a2t and i2t ran their encoders on the worker; their repeats are held by the media cache
    assert engine.workers.stats["steps"] >= 2 and engine.workers.stats["recv_bytes"] > 0
