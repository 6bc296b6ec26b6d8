"""The GPU engine tests' traffic: 12 t2t requests of 3 to 300 random token ids arriving over 20 steps (chunked
prefills, mixed steps, decode at several rungs), greedy, 20 tokens each, end of turn ignored; every logit row
the engine samples from is recorded by (request id, row)."""
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
