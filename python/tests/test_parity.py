"""Python results against the CLI's files bit for bit (the same engine calls must give the same bits), and against
the transformers / float64 fixtures within the CPU tolerance the C++ tests use (1e-4 relative)."""
import json

import numpy as np
import pytest

import diffscope
from conftest import DEMO, TWIN, cli, fixture_dirs, read_safetensors

PROMPT = "Alice keeps the red key in the blue box. Bob keeps the green key in the attic. Where is the red key?"


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def prompt_args(model):
    """A text prompt where the model has a tokenizer, else ids."""
    if (model / "tokenizer.json").exists() or (model / "tokenizer.model").exists():
        return ["--prompt", PROMPT], PROMPT
    ids = list(range(3, 40))
    return ["--token-ids", ",".join(map(str, ids))], ids


# The demo DiffLlama and its Llama twin (tokenizers), a Motif and a Phi-4-mini-flash hybrid fixture (ids).
MODELS = [DEMO, TWIN] + fixture_dirs(lambda c: c.get("model_type") in ("motif", "phi4flash"))[:2]


@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.name)
def test_full_dump_bit_for_bit(model, tmp_path):
    args, prompt = prompt_args(model)
    out = tmp_path / "d.safetensors"
    stats = tmp_path / "s.json"
    cli("--model", model, *args, "--backend", "cpu", "--threads", "2", "--dump", out, "--stats", stats)
    d = read_safetensors(out)
    with diffscope.open(model, backend="cpu", threads=2) as s:
        s.watch_max_abs_hidden()
        s.run(prompt, all_logits=True)
        np.testing.assert_array_equal(s.ids, d["input_ids"])
        assert np.array_equal(s.logits(all_positions=True), d["logits"])
        for layer in s.map_layers:
            m = s.maps(layer)
            if s.differential:
                assert np.array_equal(m.a1, d[f"layers.{layer}.attn1"]), layer
                assert np.array_equal(m.a2, d[f"layers.{layer}.attn2"]), layer
                assert np.float32(s.lambdas.effective[layer]) == d[f"layers.{layer}.lambda"][0]
            else:
                assert np.array_equal(m.a1, d[f"layers.{layer}.attn"]), layer
                assert m.a2 is None
        # --stats, key for key (the JSON holds the engine's float32 values exactly)
        js = json.loads(stats.read_text())
        st = s.stats()
        assert [l["layer"] for l in js["layers"]] == list(st.layers)
        for i, lj in enumerate(js["layers"]):
            for h, hj in enumerate(lj["heads"]):
                keys = set(hj) - {"head"}
                assert keys == set(st.keys), (keys, st.keys)
                for k in keys:
                    assert np.float32(hj[k]) == st[k][i, h] or (np.isnan(hj[k] or np.nan) and np.isnan(st[k][i, h])), k
            assert np.float32(lj["max_abs_hidden"]) == st.max_abs_hidden[i]
        np.testing.assert_array_equal(np.float32(js["max_abs_hidden"]), s.max_abs_hidden())


@pytest.mark.parametrize("model", [DEMO, TWIN, MODELS[-1]], ids=lambda p: p.name)
def test_rows_view_bit_for_bit(model, tmp_path):
    args, prompt = prompt_args(model)
    out = tmp_path / "d.safetensors"
    with diffscope.open(model, backend="cpu", threads=2) as s:
        layer = s.map_layers[-1]
        head = s.heads - 1
        cli("--model", model, *args, "--backend", "cpu", "--threads", "2", "--dump", out, "--rows", "0,-1,5",
            "--view", f"{layer}.{head}", "--grid", "7,9", "--rect", "2:30,1:21", "--pool", "mean")
        d = read_safetensors(out)
        s.run(prompt)
        r = s.rows([0, -1, 5])
        assert list(r.positions) == list(d["rows.positions"])
        for i, l in enumerate(r.layers):
            assert np.array_equal(r.a1[i], d[f"layers.{l}.rows1"])
            if s.differential:
                assert np.array_equal(r.a2[i], d[f"layers.{l}.rows2"])
        v = s.view(layer, head, grid=(7, 9), rect=(2, 30, 1, 21), pool="mean")
        assert v.rect == tuple(d["view.rect"])
        assert np.array_equal(v.a1, d["view.a1"]) and np.array_equal(v.diff, d["view.diff"])
        if s.differential:
            assert np.array_equal(v.a2, d["view.a2"])
        assert np.array_equal(s.logits(), d["logits"][-1])


@pytest.mark.parametrize("sampling", [[], ["--temperature", "0.9", "--seed", "7", "--sample-top-k", "40", "--top-p", "0.95"]],
                         ids=["greedy", "sampled"])
def test_generation_bit_for_bit(sampling, tmp_path):
    p = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--generate", "12",
            "--ignore-eos", "--json", *sampling)
    want = json.loads(p.stdout)
    kw = {}
    if sampling:
        kw = dict(temperature=0.9, seed=7, top_k=40, top_p=0.95)
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        s.run(PROMPT)
        got = [t.id for t in s.generate(12, stop_at_eos=False, **kw)]
        assert got == want["generated"] == s.generated
        assert s.stop_reason == want["stop_reason"]
        assert s.generated_text == want["text"]
        assert [(t.id, np.float32(t.prob)) for t in s.top_k(5)] == [(t["id"], np.float32(t["prob"])) for t in want["top_k"]]


def test_lambda_override_bit_for_bit(tmp_path):
    p = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--lambda", "2=0.1",
            "--lambda-scale", "0.5", "--top-k", "8", "--json")
    want = json.loads(p.stdout)
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        s.run(PROMPT)  # then the change: a re-run from layer 2 must equal the CLI's run from scratch
        s.lambda_scale = 0.5
        s.set_lambda(2, 0.1)
        assert s.stale_from == 0
        s.run()
        assert list(s.lambdas.effective) == want["lambda"]
        assert [(t.id, np.float32(t.prob), np.float32(t.logit)) for t in s.top_k(8)] == \
            [(t["id"], np.float32(t["prob"]), np.float32(t["logit"])) for t in want["top_k"]]


@pytest.mark.parametrize("fixture", fixture_dirs(), ids=lambda p: p.name)
def test_matches_reference_fixture(fixture):
    """transformers (DiffLlama, Llama) or the float64 references (Motif, Phi-4-mini-flash): logits, maps, and the
    run with lambda overridden, through the Python API."""
    ex = read_safetensors(fixture / "expected.safetensors")
    with diffscope.open(fixture, backend="cpu", threads=2) as s:
        s.run(ex["input_ids"].astype(np.int32), all_logits=True)
        assert rel_err(s.logits(True), ex["logits"]) < 1e-4
        for layer in s.map_layers:
            m = s.maps(layer)
            key = f"layers.{layer}.attn1" if s.differential else f"layers.{layer}.attn"
            if key in ex:
                assert rel_err(m.a1, ex[key]) < 1e-4, layer
            if s.differential and f"layers.{layer}.attn2" in ex:
                assert rel_err(m.a2, ex[f"layers.{layer}.attn2"]) < 1e-4, layer
        if "override.lambda" in ex:
            lam = ex["override.lambda"]  # one value per layer with maps, in order
            for i, layer in enumerate(s.map_layers):
                s.set_lambda(layer, float(lam[i]))
            assert s.stale_from == s.map_layers[0]  # a re-run from the first changed layer
            s.run(all_logits=True)
            assert rel_err(s.logits(True), ex["override.logits"]) < 1e-4
            for layer in s.map_layers:
                if f"override.layers.{layer}.attn1" in ex:
                    assert rel_err(s.maps(layer).a1, ex[f"override.layers.{layer}.attn1"]) < 1e-4, layer
