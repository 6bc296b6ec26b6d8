"""The Qwen3-Omni thinker node against HF's Qwen3OmniMoeThinker (transformers 5.24), loaded through graphc's
checkpoint loader from the safetensors HF wrote (per-expert tensors fused on load).

Covers: chunked prefill of two packed sequences plus decode rows through PagedTorch, the audio and visual
splices (random encoder rows stand in for the encoders), deepstack, M-RoPE positions (mrope.rope_index vs
HF's get_rope_index, audio-in-video included), the talker-facing outputs, greedy generation, and a fake
(meta) trace of the node for the compiler. Every HF weight is re-drawn first (norms included), and the node
and its MoE block also run in bf16 against HF's bf16 run (both measured from HF fp32, weights.py's rule).
"""
import copy

import pytest
import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeThinkerConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeThinkerForConditionalGeneration, _get_feat_extract_output_lengths)

import graphc as gc
from graphc.runtime.checkpoint import load_weights
from graphc.simulate import FakeNode
from graphc.step import StepContext
from models.components.mrope import MediaTokens, rope_index
from models.components.thinker import THINKER_30B_A3B, Thinker, ThinkerConfig, thinker_ports
from resources import PagedKVSpec
from resources.paged_kv import PageAllocator, PagedTorch, new_cache
from tests.conftest import rel
from tests.parity.weights import (assert_bf16_close, assert_norm_eps_match, bf16, check_moe_block_bf16, randomize,
                                  route_to_all_experts)

AUDIO, IMAGE, VIDEO, AUDIO_START, VISION_START, AUDIO_END, VISION_END = 120, 121, 122, 123, 124, 125, 126
MEDIA = MediaTokens(audio_token_id=AUDIO, image_token_id=IMAGE, video_token_id=VIDEO, audio_start_token_id=AUDIO_START,
                    vision_start_token_id=VISION_START, position_id_per_seconds=13, spatial_merge_size=2)
CFG = ThinkerConfig(vocab_size=128, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=16, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=3, norm_topk_prob=True,
                    mrope_section=(4, 2, 2), accept_hidden_layer=2)
DEEPSTACK = 2


def hf_config() -> Qwen3OmniMoeThinkerConfig:
    c = CFG
    text = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=64,
                num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
                moe_intermediate_size=c.moe_intermediate_size, num_experts=c.num_experts,
                num_experts_per_tok=c.num_experts_per_tok, norm_topk_prob=True, max_position_embeddings=512,
                rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta,
                                 "mrope_section": list(c.mrope_section), "interleaved": True})
    audio = dict(num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16,
                 output_dim=c.hidden_size, downsample_hidden_size=8)
    vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=c.hidden_size,
                  deepstack_visual_indexes=list(range(DEEPSTACK)), num_position_embeddings=16, patch_size=4)
    return Qwen3OmniMoeThinkerConfig(text_config=text, audio_config=audio, vision_config=vision, audio_token_id=AUDIO,
                                     image_token_id=IMAGE, video_token_id=VIDEO, audio_start_token_id=AUDIO_START,
                                     vision_start_token_id=VISION_START, position_id_per_seconds=13)



@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.manual_seed(0)
    hf = Qwen3OmniMoeThinkerForConditionalGeneration(hf_config()).eval()
    randomize(hf, seed=0, bf16_exact=True)
    path = tmp_path_factory.mktemp("thinker")
    hf.save_pretrained(path)
    ours = Thinker(CFG).eval()
    report = load_weights(ours, path, strict=False)   # the checkpoint also holds audio_tower.* and visual.*
    # stacked at load: each layer's experts (gate_up, down) and q/k/v
    assert report.loaded == len(ours.state_dict()) and report.fused == 3 * CFG.num_hidden_layers
    spec = PagedKVSpec(name="kv", num_layers=CFG.num_hidden_layers, num_qo_heads=CFG.num_attention_heads,
                       num_kv_heads=CFG.num_key_value_heads, head_dim=CFG.head_dim, page_size=4, max_seq_len=64,
                       dtype="float32")
    return hf, ours, spec


class Seq:
    """One request: its tokens with per-row positions and encoder-row indices, extended as it decodes."""

    def __init__(self, ids, positions, delta, audio_rows, visual_rows):
        self.ids, self.delta = list(ids), delta
        self.positions = positions                  # [3, L]
        self.audio_rows, self.visual_rows = list(audio_rows), list(visual_rows)

    def append(self, tok: int) -> None:
        p = len(self.ids) + self.delta
        self.ids.append(tok)
        self.positions = torch.cat([self.positions, torch.full((3, 1), p)], dim=1)
        self.audio_rows.append(-1)
        self.visual_rows.append(-1)


class Engine:
    """A minimal paged driver: chunks of several sequences in one step, as the runtime builds them."""

    def __init__(self, model, spec, media=None):
        self.model, self.spec, self.media = model, spec, media
        self.cache = new_cache(spec, 64)
        self.alloc = PageAllocator(64)
        self.tables, self.lens = {}, {}

    def step(self, seqs: dict[int, Seq], chunks: dict[int, int], every_row: bool = False) -> dict[str, torch.Tensor]:
        """chunks: sequence id -> rows to run from where it stands; media: (audio_embeds, visual_embeds, deepstack).
        Logits of each chunk's last row, or of every row of the step."""
        ids, pos, arows, vrows, qo, kv, tables, sample = [], [], [], [], [], [], [], []
        for sid, n in chunks.items():
            s, table, start = seqs[sid], self.tables.setdefault(sid, []), self.lens.get(sid, 0)
            table += self.alloc.allocate(self.spec.pages_for(start + n) - len(table))
            ids += s.ids[start:start + n]
            pos.append(s.positions[:, start:start + n])
            arows += s.audio_rows[start:start + n]
            vrows += s.visual_rows[start:start + n]
            self.lens[sid] = start + n
            qo.append(n), kv.append(start + n), tables.append(table)
            sample += range(len(ids) - n, len(ids)) if every_row else [len(ids) - 1]
        inputs = dict(token_ids=torch.tensor(ids), positions=torch.cat(pos, dim=1), sample_rows=torch.tensor(sample))
        if self.media is not None:
            audio, visual, deepstack = self.media
            inputs.update(audio_embeds=audio, audio_rows=torch.tensor(arows), visual_embeds=visual,
                          visual_rows=torch.tensor(vrows), deepstack=deepstack)
        ctx = StepContext({"kv": PagedTorch(self.spec, self.cache, qo, kv, tables)})
        with torch.no_grad():
            return self.model(ctx, **inputs)


def text(n: int, gen: torch.Generator) -> list[int]:
    return torch.randint(0, AUDIO, (n,), generator=gen).tolist()


def multimodal_prompts():
    """A: text, audio, text, image, text. B: text, image, text, video, text. Grids are in patches (merge 2)."""
    g = torch.Generator().manual_seed(1)
    mel = 70
    n_audio = int(_get_feat_extract_output_lengths(torch.tensor(mel)))
    img_a, img_b, vid_b = (1, 4, 6), (1, 2, 4), (2, 4, 4)
    n_img_a, n_img_b, n_vid_b = 6, 2, 8
    a = (text(3, g) + [AUDIO_START] + [AUDIO] * n_audio + [AUDIO_END] + text(2, g) + [VISION_START]
         + [IMAGE] * n_img_a + [VISION_END] + text(2, g))
    b = (text(2, g) + [VISION_START] + [IMAGE] * n_img_b + [VISION_END] + text(3, g) + [VISION_START]
         + [VIDEO] * n_vid_b + [VISION_END] + text(2, g))
    return dict(a=a, b=b, mel=mel, n_audio=n_audio, img_a=img_a, img_b=img_b, vid_b=vid_b)


def multimodal_seqs(p) -> dict[int, Seq]:
    """The two prompts of multimodal_prompts as Seqs: audio rows from row 3 on, B's visual rows after A's 6."""
    seqs = {}
    for sid, ids, kw, voff in ((0, p["a"], dict(audio_lengths=[p["n_audio"]], image_grid_thw=[p["img_a"]]), 0),
                               (1, p["b"], dict(image_grid_thw=[p["img_b"]], video_grid_thw=[p["vid_b"]],
                                                video_second_per_grid=[1.0]), 6)):
        pos, delta = rope_index(ids, MEDIA, **kw)
        seqs[sid] = Seq(ids, pos, delta, running_index(ids, {AUDIO}, 3), running_index(ids, {IMAGE, VIDEO}, voff))
    return seqs


def hf_positions(hf, ids, **kw) -> torch.Tensor:
    pos, _ = hf.model.get_rope_index(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     **kw)
    return pos[:, 0]                                                   # [3, L]


def running_index(ids: list[int], tokens: set[int], offset: int) -> list[int]:
    out, n = [], offset
    for t in ids:
        out.append(n if t in tokens else -1)
        n += t in tokens
    return out


def hf_forward(hf, ids, positions, audio, audio_rows, visual, visual_rows, deepstack):
    """HF's text model on one sequence, with the encoder rows scattered as HF's masked_scatter does."""
    lm = hf.model.language_model
    ids_t = torch.tensor([ids])
    emb = lm.embed_tokens(ids_t)
    audio, visual, deepstack = (t.to(emb.dtype) for t in (audio, visual, deepstack))
    amask = torch.tensor([[r >= 0 for r in audio_rows]])
    vmask = torch.tensor([[r >= 0 for r in visual_rows]])
    arows = [r for r in audio_rows if r >= 0]
    vrows = [r for r in visual_rows if r >= 0]
    emb = emb.masked_scatter(amask[..., None], audio[arows])
    emb = emb.masked_scatter(vmask[..., None], visual[vrows])
    with torch.no_grad():
        out = lm(inputs_embeds=emb, position_ids=positions[:, None], visual_pos_masks=vmask,
                 deepstack_visual_embeds=[d[vrows] for d in deepstack], output_hidden_states=True)
        logits = hf.lm_head(out.last_hidden_state)[0].float()
    return logits, out.hidden_states[0][0], out.hidden_states[CFG.accept_hidden_layer][0]


def test_prefill_chunks_and_decode_with_audio_image_video_and_deepstack_match_hf(pair):
    hf, ours, spec = pair
    p = multimodal_prompts()
    torch.manual_seed(2)
    h = CFG.hidden_size
    audio = torch.randn(p["n_audio"] + 3, h)                            # 3 spare rows: indices need not start at 0
    n_vis = 6 + 2 + 8
    visual, deepstack = torch.randn(n_vis, h), torch.randn(DEEPSTACK, n_vis, h)
    seqs = multimodal_seqs(p)
    want_a = hf_positions(hf, p["a"], image_grid_thw=torch.tensor([p["img_a"]]),
                          audio_seqlens=torch.tensor([p["mel"]]))
    want_b = hf_positions(hf, p["b"], image_grid_thw=torch.tensor([p["img_b"]]),
                          video_grid_thw=torch.tensor([p["vid_b"]]), second_per_grids=torch.tensor([1.0]))
    assert torch.equal(seqs[0].positions, want_a.long()) and torch.equal(seqs[1].positions, want_b.long())
    assert seqs[0].delta < 0 < seqs[1].delta             # grids compress positions, video time spreads them

    eng = Engine(ours, spec, media=(audio, visual, deepstack))
    la, lb = len(p["a"]), len(p["b"])
    plan = [{0: 7}, {0: 8, 1: 5}, {0: la - 15, 1: 9}, {1: lb - 14}]    # chunks split audio, image and video runs
    sampled = {0: [], 1: []}                                            # (row index, our logits)
    outs = []
    for chunks in plan:
        out = eng.step(seqs, chunks)
        outs.append((chunks, out))
        for k, sid in enumerate(chunks):
            sampled[sid].append((eng.lens[sid] - 1, out["logits"][k]))
    for _ in range(3):                                                  # decode rows for both, greedy
        for sid in (0, 1):
            seqs[sid].append(int(sampled[sid][-1][1].argmax()))
        out = eng.step(seqs, {0: 1, 1: 1})
        for k in (0, 1):
            sampled[k].append((eng.lens[k] - 1, out["logits"][k]))

    for sid in (0, 1):
        s = seqs[sid]
        logits, embeds, hidden = hf_forward(hf, s.ids, s.positions, audio, s.audio_rows, visual, s.visual_rows,
                                            deepstack)
        for row, got in sampled[sid]:
            assert rel(got, logits[row]) < 1e-5, (sid, row)
        # the talker-facing outputs of the prefill steps, row for row
        start = 0
        for chunks, out in outs:
            offset = sum(n for k, n in chunks.items() if k < sid)
            if sid in chunks:
                n = chunks[sid]
                assert rel(out["embeds"][offset:offset + n], embeds[start:start + n]) < 1e-6
                assert rel(out["hidden"][offset:offset + n], hidden[start:start + n]) < 1e-5
                start += n


def test_text_only_step_leaves_the_media_groups_out(pair):
    hf, ours, spec = pair
    ids = text(9, torch.Generator().manual_seed(3))
    s = Seq(ids, torch.arange(9).expand(3, -1), 0, [-1] * 9, [-1] * 9)
    out = Engine(ours, spec).step({0: s}, {0: 9})
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids])).logits[0, -1]
    assert set(out) == {"logits", "embeds", "hidden"} and rel(out["logits"][0], ref) < 1e-5


def test_norm_epsilons_match_hf(pair):
    n = assert_norm_eps_match(pair[1], pair[0], lambda name: name.replace("model.", "model.language_model.", 1))
    assert n == 4 * CFG.num_hidden_layers + 1


def test_greedy_tokens_match_hf_generate(pair):
    hf, ours, spec = pair
    prompt = text(6, torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = hf.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, 6, dtype=torch.long),
                           max_new_tokens=12, do_sample=False)[0, len(prompt):].tolist()
    pos, delta = rope_index(prompt, MEDIA)
    s = Seq(prompt, pos, delta, [-1] * 6, [-1] * 6)
    eng = Engine(ours, spec)
    logits, got = eng.step({0: s}, {0: 6})["logits"], []
    for _ in range(12):
        got.append(int(logits[0].argmax()))
        s.append(got[-1])
        logits = eng.step({0: s}, {0: 1})["logits"]
    assert got == want


def test_bf16_node_matches_hf_bf16_within_hf_rounding(pair):
    """Both multimodal prompts prefilled in two packed chunks through a bf16 cache; logits of every row and
    the talker-facing outputs against HF's bf16 run, both measured from HF fp32 (weights.py's rule). Rows are
    routed to all 8 experts in both runs (weights.route_to_all_experts).
    Measured rel error from HF fp32, graphc bf16 / HF bf16 (transformers 5.24, torch 2.13, CPU): logits
    0.00915 / 0.00932, hidden 0.00635 / 0.00633; embeds 0 / 0 (bf16-exact weights and media rows). Weight seeds
    1-3 gave logits ratios 0.98-1.03. With top-3 routing instead, rows that pick other experts than fp32's
    took both errors to 0.047, a count of swaps rather than rounding (see route_to_all_experts)."""
    hf, ours, spec = pair
    hf = route_to_all_experts(copy.deepcopy(hf))          # see route_to_all_experts; top-k: the MoE block test
    hf16, ours16 = bf16(hf), route_to_all_experts(bf16(ours))
    p = multimodal_prompts()
    g = torch.Generator().manual_seed(6)
    h = CFG.hidden_size
    audio = torch.randn(p["n_audio"] + 3, h, generator=g).bfloat16()      # bf16-exact: one input for both runs
    visual = torch.randn(16, h, generator=g).bfloat16()
    deepstack = torch.randn(DEEPSTACK, 16, h, generator=g).bfloat16()
    seqs = multimodal_seqs(p)
    eng = Engine(ours16, spec.model_copy(update={"dtype": "bfloat16"}), media=(audio, visual, deepstack))
    la, lb = len(p["a"]), len(p["b"])
    first = eng.step(seqs, {0: 12, 1: 9}, every_row=True)
    second = eng.step(seqs, {0: la - 12, 1: lb - 9}, every_row=True)
    got = {k: torch.cat([first[k][:12], second[k][:la - 12], first[k][12:], second[k][la - 12:]])
           for k in ("logits", "embeds", "hidden")}
    ref, ref16 = ([torch.cat(t) for t in zip(*(hf_forward(model, s.ids, s.positions, audio.float(), s.audio_rows,
                                                          visual.float(), s.visual_rows, deepstack.float())
                                                for s in seqs.values()))] for model in (hf, hf16))
    for name, want, want16 in zip(("logits", "embeds", "hidden"), ref, ref16):
        ours_err, hf_err = assert_bf16_close(got[name], want16, want, name)
        print(f"thinker bf16 {name}: graphc {ours_err:.3g}, HF {hf_err:.3g}")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bf16_moe_block_routes_and_matches_like_hf(pair, seed):
    """The thinker's MoE block alone in bf16 on 256 rows, router drawn narrow (weights.ROUTER_GAIN) so that a
    softmax taken in bf16 instead of fp32 swaps experts. Measured rel error from HF fp32, graphc bf16 = HF bf16
    (the same ops in the same order), seeds 0/1/2: router weights 0.00169 / 0.00167 / 0.00165, block output
    0.00466 / 0.00473 / 0.00502. With the router's softmax in bf16 (moe.py's dtype=torch.float32 dropped):
    24-26 of 256 rows route to other experts, router weights 0.245-0.25 and output 0.197-0.229 from fp32,
    40-150 x HF's; with the top-k probabilities cast to bf16 before renormalising: router weights 1.72-1.86 x."""
    hf, ours = pair[:2]
    errors = check_moe_block_bf16(hf.model.language_model.layers[0].mlp, ours.model.layers[0].mlp, seed=seed)
    print(f"thinker MoE block bf16 seed {seed}:", {k: f"graphc {g:.3g}, HF {h:.3g}" for k, (g, h) in errors.items()})


def test_positions_match_hf_for_audio_in_video_and_trailing_items(pair):
    hf = pair[0]
    g = torch.Generator().manual_seed(5)
    mel_a, mel_v = 230, 150
    na, nv = (int(_get_feat_extract_output_lengths(torch.tensor(m))) for m in (mel_a, mel_v))
    grid = (3, 4, 4)                                                    # 3 frame groups of 2x2 merged tokens
    ids = (text(2, g) + [VISION_START, AUDIO_START] + [VIDEO] * 12 + [AUDIO] * nv + [AUDIO_END, VISION_END]
           + text(1, g) + [AUDIO_START] + [AUDIO] * na + [AUDIO_END] + text(3, g))
    got, delta = rope_index(ids, MEDIA, audio_lengths=[nv, na], video_grid_thw=[grid], video_second_per_grid=[2.0])
    want = hf_positions(hf, ids, video_grid_thw=torch.tensor([grid]), audio_seqlens=torch.tensor([mel_v, mel_a]),
                        second_per_grids=torch.tensor([2.0]), use_audio_in_video=True)
    assert torch.equal(got, want.long())
    assert delta == int(want.max()) + 1 - len(ids)
    with pytest.raises(ValueError, match="fractional"):
        rope_index(ids, MEDIA, audio_lengths=[nv, na], video_grid_thw=[grid], video_second_per_grid=[0.3])


def thinker_node() -> gc.Node:
    inputs, outputs = thinker_ports(CFG, "windows*13", "patches/4", DEEPSTACK)
    return gc.Node(name="thinker", module=Thinker, config=CFG, weight_prefix="thinker.", inputs=inputs,
                   outputs=outputs, resources={"kv": "thinker_kv"})


@pytest.mark.parametrize("groups", [(), ("audio", "visual")], ids=["text", "multimodal"])
def test_node_traces_on_meta_tensors(groups):
    node = thinker_node()
    spec = PagedKVSpec(name="thinker_kv", num_layers=CFG.num_hidden_layers, num_qo_heads=CFG.num_attention_heads,
                       num_kv_heads=CFG.num_key_value_heads, head_dim=CFG.head_dim, max_seq_len=256, pages=64)
    sizes = {"tokens": 24, "seqs": 3, "windows": 1, "patches": 32}
    ports = {k: p for k, p in node.inputs.items() if p.optional is None or p.optional in groups}
    bindings = {"kv": spec.fake(spec.step_shape("tokens", sizes, "prefill"))}
    t = FakeNode(node).trace(ports, sizes, bindings, "thinker")
    assert t.peak_bytes > 0
    assert t.output_bytes == 3 * CFG.vocab_size * 4 + 2 * 24 * CFG.hidden_size * 2


def test_real_config_holds_the_checkpoint_parameter_count():
    with torch.device("meta"):
        model = Thinker(THINKER_30B_A3B)
    assert sum(p.numel() for p in model.parameters()) == 30_532_646_912      # the fact sheet's section 2
