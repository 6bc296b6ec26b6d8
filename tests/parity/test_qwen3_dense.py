"""The dense Qwen3 decoder (Qwen3-ASR's text model, the tiny models' decoder) against HF Qwen3,
loaded through graphc's checkpoint loader from the safetensors file HF itself wrote. Every HF weight is
re-drawn first (norms and q/k norms included: a k projected through q_norm must show), and the node runs
in fp32 and in bf16 (against HF's bf16 run, both measured from HF fp32)."""
import pytest
import torch
from transformers import Qwen3Config as HFConfig
from transformers import Qwen3ForCausalLM

from graphc.runtime.checkpoint import load_weights
from models.components.qwen3_dense import Qwen3Config, Qwen3LM
from resources import PagedKVSpec
from resources.paged_kv import PageAllocator, PagedTorch, new_cache
from graphc.step import StepContext
from tests.conftest import rel
from tests.parity.weights import assert_bf16_close, assert_norm_eps_match, bf16, randomize

CFG = dict(vocab_size=96, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32,
           intermediate_size=80, rope_theta=1_000_000.0, rms_norm_eps=1e-6)



@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def pair(request, tmp_path_factory):
    torch.manual_seed(0)
    tied = request.param
    hf = Qwen3ForCausalLM(HFConfig(vocab_size=96, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=32, intermediate_size=80,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                   rms_norm_eps=1e-6, tie_word_embeddings=tied)).eval()
    randomize(hf, seed=0, bf16_exact=True)
    path = tmp_path_factory.mktemp("qwen3")
    hf.save_pretrained(path)
    ours = Qwen3LM(Qwen3Config(**CFG, tie_word_embeddings=tied)).eval()
    load_weights(ours, path)
    spec = PagedKVSpec(name="kv", num_layers=3, num_qo_heads=4, num_kv_heads=2, head_dim=32, page_size=4,
                       max_seq_len=64, dtype="float32")
    return hf, ours, spec


class Engine:
    """A minimal paged driver: chunks of several sequences in one step, as the runtime builds them."""

    def __init__(self, model, spec):
        self.model, self.spec = model, spec
        self.cache = new_cache(spec, 64)
        self.alloc = PageAllocator(64)
        self.tables, self.lens = {}, {}

    def step(self, chunks: dict[int, list[int]], every_row: bool = False) -> torch.Tensor:
        """Logits of each chunk's last row, or of every row of the step."""
        ids, pos, qo, kv, tables, sample = [], [], [], [], [], []
        for sid, toks in chunks.items():
            table = self.tables.setdefault(sid, [])
            start = self.lens.get(sid, 0)
            need = self.spec.pages_for(start + len(toks)) - len(table)
            table += self.alloc.allocate(need)
            ids += toks
            pos += list(range(start, start + len(toks)))
            self.lens[sid] = start + len(toks)
            qo.append(len(toks)), kv.append(self.lens[sid]), tables.append(table)
            sample += range(len(ids) - len(toks), len(ids)) if every_row else [len(ids) - 1]
        ctx = StepContext({"kv": PagedTorch(self.spec, self.cache, qo, kv, tables)})
        with torch.no_grad():
            return self.model(ctx, token_ids=torch.tensor(ids), positions=torch.tensor(pos),
                              sample_rows=torch.tensor(sample))["logits"]


def test_prefill_in_chunks_and_decode_match_hf(pair):
    hf, ours, spec = pair
    torch.manual_seed(1)
    a, b = torch.randint(0, 96, (13,)).tolist(), torch.randint(0, 96, (7,)).tolist()
    eng = Engine(ours, spec)
    eng.step({0: a[:5]})
    out = eng.step({0: a[5:], 1: b[:3]})            # a mixed step: one sequence finishes, one starts
    out_b = eng.step({1: b[3:]})
    with torch.no_grad():
        ref_a = hf(torch.tensor([a])).logits[0, -1]
        ref_b = hf(torch.tensor([b])).logits[0, -1]
    assert rel(out[0], ref_a) < 1e-5 and rel(out_b[0], ref_b) < 1e-5
    nxt = eng.step({0: [5], 1: [6]})               # decode rows for both
    with torch.no_grad():
        ref = hf(torch.tensor([a + [5]])).logits[0, -1], hf(torch.tensor([b + [6]])).logits[0, -1]
    assert rel(nxt[0], ref[0]) < 1e-5 and rel(nxt[1], ref[1]) < 1e-5


def test_norm_epsilons_match_hf(pair):
    assert assert_norm_eps_match(pair[1], pair[0]) == 4 * CFG["num_layers"] + 1


def test_greedy_tokens_match_hf_generate(pair):
    hf, ours, spec = pair
    prompt = [3, 14, 15, 92, 65, 35]
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):].tolist()
    eng = Engine(ours, spec)
    got, logits = [], eng.step({0: prompt})
    for _ in range(12):
        tok = int(logits[0].argmax())
        got.append(tok)
        logits = eng.step({0: [tok]})
    assert got == want


def test_bf16_matches_hf_bf16_within_hf_rounding(pair):
    """Both sequences prefilled in two packed chunks through a bf16 cache, logits of every row (44 rows), against
    HF's bf16 run, both measured from HF fp32 (weights.py's rule). Measured rel error from fp32, graphc bf16 /
    HF bf16 (transformers 5.24, torch 2.13, CPU): untied 0.0115 / 0.0118, tied 0.0116 / 0.0120; weight seeds
    1-3: ratios 0.90-1.00."""
    hf, ours, spec = pair
    hf16, eng = bf16(hf), Engine(bf16(ours), spec.model_copy(update={"dtype": "bfloat16"}))
    g = torch.Generator().manual_seed(2)
    a, b = torch.randint(0, 96, (26,), generator=g).tolist(), torch.randint(0, 96, (18,), generator=g).tolist()
    first, second = eng.step({0: a[:11], 1: b[:7]}, every_row=True), eng.step({0: a[11:], 1: b[7:]}, every_row=True)
    got = torch.cat([first[:11], second[:15], first[11:], second[15:]])
    with torch.no_grad():
        ref = torch.cat([hf(torch.tensor([s])).logits[0] for s in (a, b)])
        ref16 = torch.cat([hf16(torch.tensor([s])).logits[0] for s in (a, b)])
    ours_err, hf_err = assert_bf16_close(got, ref16, ref, "logits")
    print(f"qwen3 dense bf16: graphc {ours_err:.3g}, HF {hf_err:.3g}")
