"""The GPU engine tests' traffic: 12 t2t requests of 3 to 300 random token ids arriving over 20 steps (chunked
prefills, mixed steps, decode at several rungs), greedy, 20 tokens each, end of turn ignored; every logit row
the engine samples from is recorded by (request id, row). And speaking traffic: six greedy t2s chat turns of 12
random ids arriving over 8 steps."""
from __future__ import annotations

import torch

from graphc.runtime.sampler import SamplingParams

LENGTHS = [5, 40, 130, 7, 300, 16, 64, 3, 90, 200, 33, 12]
ARRIVALS = [0, 0, 0, 1, 1, 2, 4, 4, 6, 9, 12, 20]


def run_arrivals(engine, max_tokens: int = 20) -> tuple[list, dict[tuple[str, int], torch.Tensor]]:
    """(the requests, in arrival order; the sampled logit rows, on the CPU in fp32) once the engine is idle."""
    seen: dict[tuple[str, int], torch.Tensor] = {}
    run = engine.executor.run

    def recording(plan, **kw):
        result = run(plan, **kw)
        for c, row in zip([c for c in plan.chunks if c.sample], result.logits):
            seen[(c.req.id, c.end - 1)] = row.float().cpu()
        return result
    engine.executor.run = recording
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in LENGTHS]
    reqs, step = [], 0
    while len(reqs) < len(prompts) or engine.has_work():
        for i, at in enumerate(ARRIVALS):
            if at == step:
                reqs.append(engine.add(prompt_token_ids=prompts[i],
                                       params=SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)))
        engine.step()
        step += 1
    return reqs, seen


SPEECH_ARRIVALS = [0, 0, 1, 3, 3, 8]


def run_speech(engine) -> list:
    """Six greedy t2s requests (a chat turn: user text of 12 random ids, then the assistant), 6 text tokens and up
    to 40 frames each, added at the steps SPEECH_ARRIVALS names; the requests, in arrival order, once idle."""
    from graphc.runtime.speech import SpeechParams

    gen = torch.Generator().manual_seed(0)
    reqs, step = [], 0
    while len(reqs) < len(SPEECH_ARRIVALS) or engine.has_work():
        for at in SPEECH_ARRIVALS:
            if at == step:
                sp = engine.host.speech.ids
                text = torch.randint(0, 150_000, (12,), generator=gen).tolist()
                ids = [sp["im_start_token_id"], sp["user_token_id"], 198, *text, 198, sp["im_start_token_id"],
                       sp["assistant_token_id"], 198]
                reqs.append(engine.add(prompt_token_ids=ids, params=SamplingParams(temperature=0, max_tokens=6,
                                                                                   ignore_eos=True),
                                       speech=SpeechParams(max_frames=40, temperature=0)))
        engine.step()
        step += 1
    return reqs
