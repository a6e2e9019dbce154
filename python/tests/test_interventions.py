"""Head interventions (the one forward's HeadOut writer): a head's output scaled or zeroed equals, on every family,
a forward of a copy of the checkpoint whose o_proj columns of that head are scaled the same way (an independent
construction of the same function); the CLI's --ablate / --scale-head give the same bits as the module."""
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import diffscope
from conftest import DEMO, TWIN, cli, cuda_or_skip, fixture_dirs

PROMPT = "records: 7274 -> ocean; 1505 -> nectar. question: 1505 ->"
FIXTURES = [d for d in fixture_dirs() if (d / "model.safetensors").exists() or (d / "model.safetensors.index.json").exists()]


def scaled_copy(src, dst, layer, cols, factor):
    """A copy of the checkpoint with o_proj's (out_proj's) input columns `cols` of `layer` times `factor`."""
    shutil.copytree(src, dst)
    index = dst / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    for name in (f"model.layers.{layer}.self_attn.o_proj.weight", f"model.layers.{layer}.attn.out_proj.weight"):
        for f in files:
            raw = bytearray((dst / f).read_bytes())
            n = struct.unpack("<Q", raw[:8])[0]
            header = json.loads(raw[8:8 + n])
            if name not in header:
                continue
            t = header[name]
            b, e = (8 + n + o for o in t["data_offsets"])
            rows, ncols = t["shape"]
            if t["dtype"] == "F32":
                w = np.frombuffer(raw, dtype=np.float32, count=rows * ncols, offset=b).reshape(rows, ncols).copy()
                w[:, cols[0]:cols[1]] *= np.float32(factor)
                raw[b:e] = w.tobytes()
            else:  # BF16: through f32 (0 and 0.5 are exact)
                u = np.frombuffer(raw, dtype=np.uint16, count=rows * ncols, offset=b).reshape(rows, ncols)
                w = (u.astype(np.uint32) << 16).view(np.float32).copy()
                w[:, cols[0]:cols[1]] *= np.float32(factor)
                raw[b:e] = (w.view(np.uint32) >> 16).astype(np.uint16).tobytes()
            (dst / f).write_bytes(bytes(raw))
            return
    raise AssertionError(f"no o_proj weight of layer {layer} in {src}")


def head_cols(cfg, head):
    width = cfg["heads"] * cfg["head_dim"] // cfg["view_heads"]
    return head * width, (head + 1) * width


@pytest.mark.parametrize("factor", [0.0, 0.5])
@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
def test_head_scale_equals_scaled_o_proj(fixture, factor, tmp_path):
    ids = list(range(3, 40))
    with diffscope.open(fixture, backend="cpu", threads=2) as s:
        layer = s.map_layers[len(s.map_layers) // 2]
        head = s.heads - 1
        s.run(ids, all_logits=True)
        base = s.logits(True).copy()
        s.scale_head(layer, head, factor)
        assert s.stale_from == layer
        s.run(all_logits=True)
        assert s.last_run_from == layer
        got = s.logits(True)
        cols = head_cols(s.config, head)
    assert not np.array_equal(got, base)  # the intervention changed something
    scaled_copy(fixture, tmp_path / "m", layer, cols, factor)
    with diffscope.open(tmp_path / "m", backend="cpu", threads=2) as r:
        r.run(ids, all_logits=True)
        want = r.logits(True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_interventions_list_rerun_and_errors(demo):
    demo.run(PROMPT)
    base = demo.logprobs().copy()
    demo.ablate(2, 1)
    demo.scale_head(4, 0, 0.5)
    assert demo.interventions == [{"kind": "ablate", "mode": "head", "layer": 2, "head": 1},
                                  {"layer": 4, "head": 0, "kind": "scale", "factor": 0.5}]
    assert demo.stale_from == 2
    demo.run()
    changed = demo.logprobs().copy()
    demo.scale_head(2, 1, None)  # removed: a re-run from layer 2
    assert demo.stale_from == 2 and len(demo.interventions) == 1
    demo.clear_interventions()
    demo.run()
    np.testing.assert_array_equal(demo.logprobs(), base)  # reversible, bit for bit
    assert not np.array_equal(changed, base)
    for f, needle in [(lambda: demo.ablate(99, 0), "does not exist"), (lambda: demo.ablate(0, 99), "head 99"),
                      (lambda: demo.ablate(0, 0, mode="a3"), "not known"),
                      (lambda: demo.scale_head(0, 0, float("nan")), "finite")]:
        with pytest.raises(diffscope.Error, match=needle):
            f()
    assert demo.interventions == []


def _generation_matches_full_forwards(s, k):
    """Generates k greedy tokens after PROMPT under the interventions in force; each must be the greedy choice of a
    full forward of the sequence so far under the same interventions. Leaves the session without them."""
    s.run(PROMPT)
    n0 = s.n
    got = [t.id for t in s.generate(k, stop_at_eos=False)]
    seq = list(s.ids)
    for i, tok in enumerate(got):
        s.run(seq[:n0 + i])
        assert s.top_k(1)[0].id == tok, i
    s.clear_interventions()
    s.run(seq[:n0])
    s.clear_generation()


def test_interventions_apply_to_generation(demo):
    """The decoding steps carry the writer: each generated token is the greedy choice of a full forward of the
    sequence so far under the same intervention."""
    demo.clear_interventions()
    for h in range(demo.heads):
        demo.ablate(3, h)
    _generation_matches_full_forwards(demo, 5)


def test_cli_ablate_bit_for_bit(tmp_path):
    p = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--ablate", "3.1",
            "--scale-head", "5.2=0.25", "--ablate", "1.0:head", "--top-k", "6", "--json")
    want = json.loads(p.stdout)
    assert want["interventions"] == [{"kind": "ablate", "mode": "head", "layer": 3, "head": 1},
                                     {"layer": 5, "head": 2, "kind": "scale", "factor": 0.25},
                                     {"kind": "ablate", "mode": "head", "layer": 1, "head": 0}]
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        s.ablate(3, 1)
        s.scale_head(5, 2, 0.25)
        s.ablate(1, 0)
        s.run(PROMPT)
        assert [(t.id, np.float32(t.prob)) for t in s.top_k(6)] == [(t["id"], np.float32(t["prob"])) for t in want["top_k"]]
    bad = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--ablate", "3.9", check=False)
    assert bad.returncode == 2 and "head 9" in bad.stderr and bad.stderr.count("\n") == 1
    bad = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--ablate", "3.1:avg", check=False)
    assert bad.returncode == 2 and "not known" in bad.stderr


def test_cuda_head_scale_matches_the_scaled_checkpoint(tmp_path):
    cuda_or_skip()
    ids = list(range(3, 40))
    with diffscope.open(DEMO, backend="cuda") as s:
        s.scale_head(3, 1, 0.5)
        s.run(ids, all_logits=True)
        got = s.logits(True).copy()
        cols = head_cols(s.config, 1)
    scaled_copy(DEMO, tmp_path / "m", 3, cols, 0.5)
    with diffscope.open(tmp_path / "m", backend="cuda") as r:
        r.run(ids, all_logits=True)
        want = r.logits(True)
    assert np.abs(got - want).max() < 0.05 * max(1.0, np.abs(want).max())  # bf16 activations on both sides
    assert got[-1].argmax() == want[-1].argmax()


def test_head_importance_against_scaled_checkpoints(tmp_path):
    """Each entry equals log p(target) of a checkpoint with that head's o_proj columns zeroed, minus the base."""
    fx = next(d for d in FIXTURES if d.name == "diff_mha_d32_f32")
    ids = list(range(3, 40))
    with diffscope.open(fx, backend="cpu", threads=2) as s:
        s.run(ids)
        base = s.logprobs().copy()
        imp = s.head_importance()
        assert imp["complete"] and imp["target"] == int(np.argmax(base))
        assert imp["base_logp"] == pytest.approx(float(base[imp["target"]]))
        d = imp["modes"]["head"]
        assert d.shape == (len(s.map_layers), s.heads) and np.isfinite(d).all()
        assert s.interventions == [] and np.array_equal(s.logprobs(), base)  # the session is as it was
        cfg = s.config
    for li, h in [(0, 0), (len(imp["layers"]) - 1, cfg["view_heads"] - 1)]:
        layer = imp["layers"][li]
        scaled_copy(fx, tmp_path / f"m{li}", layer, head_cols(cfg, h), 0.0)
        with diffscope.open(tmp_path / f"m{li}", backend="cpu", threads=2) as r:
            r.run(ids)
            want = float(r.logprobs()[imp["target"]]) - imp["base_logp"]
        assert d[li, h] == pytest.approx(want, abs=2e-5), (layer, h)


def test_head_importance_cli_and_errors(demo, tmp_path):
    out = tmp_path / "imp.json"
    cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--importance", out,
        "--importance-target", "953", "--importance-modes", "head")
    j = json.loads(out.read_text())
    demo.clear_interventions()
    demo.run(PROMPT)
    imp = demo.head_importance(target=953)
    assert j["target"] == 953 and j["complete"] and j["layers"] == imp["layers"]
    assert np.array_equal(np.array(j["modes"]["head"]), imp["modes"]["head"])
    assert j["base_logp"] == imp["base_logp"]
    with pytest.raises(diffscope.Error, match="not known"):
        demo.head_importance(modes=("median",))
    with pytest.raises(diffscope.Error, match="vocabulary"):
        demo.head_importance(target=10 ** 6)
    bad = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--importance", out, "--importance-target",
              "99999999", check=False)
    assert bad.returncode == 2 and "--importance" in bad.stderr


# ---------------------------------------------------------------------------------------------------------------
# The attention op's edits (drop A1 / A2, a head's own lambda, knockout) against a float64 reference written from the
# published math (diffllama_ref.py, itself checked against transformers' logits here).
import diffllama_ref  # noqa: E402

REF_FIXTURES = [d for d in FIXTURES if d.name in ("diff_mha_d32_f32", "diff_gqa4_d32_sharded_v5")]


@pytest.mark.parametrize("fixture", REF_FIXTURES, ids=lambda p: p.name)
def test_reference_matches_transformers(fixture):
    from conftest import read_safetensors
    e = read_safetensors(fixture / "expected.safetensors")
    logits, hidden, _ = diffllama_ref.forward(fixture, [int(i) for i in e["input_ids"]])
    np.testing.assert_allclose(logits, e["logits"], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(hidden[-1], e[f"hidden.{len(hidden) - 1}"], atol=1e-4, rtol=1e-4)


def _layer_lambdas(s):
    return [float(x) for x in s.lambdas.effective]


@pytest.mark.parametrize("fixture", REF_FIXTURES, ids=lambda p: p.name)
def test_head_mixes_match_the_reference(fixture):
    ids = list(range(3, 40))
    with diffscope.open(fixture, backend="cpu", threads=2) as s:
        L, H = s.layers, s.heads
        s.run(ids, all_logits=True)
        base = s.logits(True).copy()
        lam = _layer_lambdas(s)
        s.ablate(0, 1, "a1")
        s.ablate(L - 1, H - 1, "a2")
        s.set_head_lambda(1, 0, 0.37)
        s.ablate(1, 2, "a1")
        s.ablate(1, 2, "a2")  # both maps dropped: the head outputs 0
        assert s.stale_from == 0
        s.run(all_logits=True)
        got = s.logits(True).copy()
        assert {(x["kind"], x.get("mode")) for x in s.interventions} == {("ablate", "a1"), ("ablate", "a2"),
                                                                          ("head_lambda", None)}
        s.clear_interventions()
        s.run(all_logits=True)
        np.testing.assert_array_equal(s.logits(True), base)  # reversible, bit for bit
    coef = {(0, 1): (0.0, lam[0]), (L - 1, H - 1): (1.0, 0.0), (1, 0): (1.0, 0.37), (1, 2): (0.0, 0.0)}
    want, _, _ = diffllama_ref.forward(fixture, ids, lambdas=lam, head_coef=coef)
    assert np.abs(want - base).max() > 1e-2  # the interventions matter
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fixture", REF_FIXTURES, ids=lambda p: p.name)
def test_knockout_matches_the_reference(fixture):
    ids = list(range(3, 40))
    n = len(ids)
    with diffscope.open(fixture, backend="cpu", threads=2) as s:
        L = s.layers
        lam = _layer_lambdas(s)
        s.knockout("all", (-1, 0), (2, 9))         # the last token does not see keys 2..8 in any layer
        s.knockout(1, (5, 20), (0, 3))            # rows 5..19 of layer 1 lose the first three keys
        s.knockout((0, 1), (0, 1), (0, 1))        # row 0 of layers 0 and 1 sees nothing
        s.run(ids, all_logits=True)
        got = s.logits(True).copy()
        maps = s.maps(1)
        assert [x["spec"] for x in s.interventions] == [f"0-{L - 1}:-1:,2:9", "1:5:20,0:3", "0-1:0:1,0:1"]
    ko = {l: [(n - 1, n, 2, 9)] for l in range(L)}
    ko[1].append((5, 20, 0, 3))
    ko[0].append((0, 1, 0, 1))
    ko[1].append((0, 1, 0, 1))
    want, _, ref_maps = diffllama_ref.forward(fixture, ids, lambdas=lam, knockout=ko)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(maps.a1, ref_maps[1][0], atol=1e-5)  # the maps show the knockout too
    np.testing.assert_allclose(maps.a2, ref_maps[1][1], atol=1e-5)
    assert maps.a1[:, 7, 0:3].max() == 0 and maps.a1[:, 0].max() == 0


def test_edits_carry_into_generation(demo):
    """Decoding steps bring the head mixes and knockouts: each generated token is the greedy choice of a full
    forward of the sequence so far under the same edits (positions from the start, so they mean the same there)."""
    demo.clear_interventions()
    demo.ablate(2, 1, "a2")
    demo.ablate(4, 0, "a1")
    demo.set_head_lambda(3, 2, 1.5)
    demo.knockout("all", (10, 19), (3, 8))
    _generation_matches_full_forwards(demo, 4)


def test_open_knockout_follows_generated_tokens(demo):
    """A query span open at the end ((-1, 0): the prompt's last token to the end of the sequence) covers every token
    generated after the prompt: the decoding steps' next-token distribution equals a full forward of the whole
    sequence with the span written out from the prompt's last position to the end, and differs from one where only the
    prompt's last position is knocked out (so the generated rows' knockout is what makes the match)."""
    demo.clear_interventions()
    keys = (0, 12)
    demo.knockout("all", (-1, 0), keys)
    demo.run(PROMPT)
    n0 = demo.n
    k = 4
    list(demo.generate(k, stop_at_eos=False))
    got = demo.logprobs().copy()
    seq = list(demo.ids)
    assert len(seq) == n0 + k
    demo.clear_interventions()
    demo.knockout("all", (n0 - 1, n0 + k), keys)
    demo.run(seq)
    np.testing.assert_allclose(got, demo.logprobs(), atol=2e-4)
    demo.clear_interventions()
    demo.knockout("all", (n0 - 1, n0), keys)
    demo.run(seq)
    assert np.abs(got - demo.logprobs()).max() > 1e-3
    demo.clear_interventions()
    demo.run(PROMPT)


def test_edit_errors(demo):
    demo.clear_interventions()
    demo.run(PROMPT)
    for f, needle in [(lambda: demo.knockout(0, (5, 3), (0, 1)), "empty or reversed"),
                      (lambda: demo.knockout(0, (2, -1), (0, 1)), "mixes positions"),
                      (lambda: demo.knockout(99, (0, 1), (0, 1)), "not layers of the model"),
                      (lambda: demo.knockout("some", (0, 1), (0, 1)), "layers"),
                      (lambda: demo.set_head_lambda(0, 99, 0.5), "head 99"),
                      (lambda: demo.set_head_lambda(0, 0, float("inf")), "finite")]:
        with pytest.raises(diffscope.Error, match=needle):
            f()
    with pytest.raises(TypeError, match="queries"):
        demo.knockout(0, 5, (0, 1))
    demo.knockout(0, (0, 1), (0, 10 ** 6))  # accepted: a span is checked against the sequence when a run resolves it
    with pytest.raises(diffscope.Error, match="outside the prompt"):
        demo.run()
    demo.clear_interventions()
    demo.run()
    with diffscope.open(TWIN, backend="cpu", threads=2) as t:
        with pytest.raises(diffscope.Error, match="not differential"):
            t.ablate(0, 0, "a2")
        t.ablate(0, 0, "head")  # a plain head is ablated whole
        t.knockout(0, (-1, 0), (0, 2))  # knockout on plain attention
        t.run(PROMPT)
        assert np.isfinite(t.logprobs()).all()


def test_importance_modes_a1_a2(tmp_path):
    fx = REF_FIXTURES[0]
    ids = list(range(3, 40))
    with diffscope.open(fx, backend="cpu", threads=2) as s:
        s.run(ids)
        imp = s.head_importance()
        assert sorted(imp["modes"]) == ["a1", "a2", "head"]
        for mode in ("a1", "a2"):
            d = imp["modes"][mode]
            assert np.isfinite(d).all() and np.abs(d).max() > 0
            for li, h in [(0, 0), (len(imp["layers"]) - 1, s.heads - 1)]:
                s.ablate(imp["layers"][li], h, mode)
                s.run()
                want = float(s.logprobs()[imp["target"]]) - imp["base_logp"]
                s.clear_interventions()
                s.run()
                assert d[li, h] == pytest.approx(want, abs=1e-6), (mode, li, h)
    out = tmp_path / "imp.json"
    cli("--model", fx, "--token-ids-file", _ids_file(tmp_path, ids), "--backend", "cpu", "--threads", "2",
        "--importance", out)
    j = json.loads(out.read_text())
    assert sorted(j["modes"]) == ["a1", "a2", "head"]
    np.testing.assert_array_equal(np.array(j["modes"]["a2"]), imp["modes"]["a2"])


def _ids_file(tmp_path, ids):
    f = tmp_path / "ids.txt"
    f.write_text(" ".join(map(str, ids)))
    return f


def test_cli_edits_bit_for_bit(tmp_path):
    p = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--ablate", "3.1:a1",
            "--ablate", "2.0:a2", "--head-lambda", "4.2=0.3", "--knockout", "all:-1:,3:9", "--top-k", "6", "--json")
    want = json.loads(p.stdout)
    assert want["interventions"] == [
        {"kind": "ablate", "mode": "a1", "layer": 3, "head": 1},
        {"kind": "ablate", "mode": "a2", "layer": 2, "head": 0},
        {"kind": "head_lambda", "layer": 4, "head": 2, "lambda": pytest.approx(0.3)},
        {"kind": "knockout", "spec": want["interventions"][3]["spec"], "layers": [0, 5], "queries": [-1, None],
         "keys": [3, 9]}]
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        s.ablate(3, 1, "a1")
        s.ablate(2, 0, "a2")
        s.set_head_lambda(4, 2, 0.3)
        s.knockout("all", (-1, 0), (3, 9))
        s.run(PROMPT)
        assert [(t.id, np.float32(t.prob)) for t in s.top_k(6)] == [(t["id"], np.float32(t["prob"])) for t in want["top_k"]]
    for args, needle in [(("--knockout", "1:5:3,0:2"), "empty or reversed"), (("--knockout", "1:x"), "--knockout"),
                         (("--head-lambda", "1.1"), "--head-lambda"), (("--knockout", "1:0:1,0:999"), "outside the prompt")]:
        bad = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", *args, check=False)
        assert bad.returncode in (2, 3) and needle in bad.stderr and bad.stderr.count("\n") == 1, (args, bad.stderr)


# ---------------------------------------------------------------------------------------------------------------
# The logit lens against the reference: each layer's output through the final norm and the LM head.
@pytest.mark.parametrize("fixture", REF_FIXTURES, ids=lambda p: p.name)
def test_lens_matches_the_reference(fixture):
    ids = list(range(3, 40))
    positions = [-1, 4, 20]
    with diffscope.open(fixture, backend="cpu", threads=2) as s:
        s.run(ids)
        lam = _layer_lambdas(s)
        lens = s.lens(positions=positions, top_k=7, target=11)
        last = s.logprobs()
        assert lens["target"] == 11 and [l["layer"] for l in lens["layers"]] == list(range(s.layers))
        default = s.lens()  # the last position, the greedy next token
        assert default["target"] == int(np.argmax(last))
    _, hidden, _ = diffllama_ref.forward(fixture, ids, lambdas=lam)
    pos = [len(ids) - 1, 4, 20]
    ref = diffllama_ref.lens(fixture, hidden, pos)
    for l, layer in enumerate(lens["layers"]):
        for i, e in enumerate(layer["positions"]):
            assert e["position"] == pos[i]
            lp = ref[l][i]
            want_top = np.argsort(-lp, kind="stable")[:7]
            assert [t["id"] for t in e["top"]] == list(want_top), (l, i)
            np.testing.assert_allclose([t["prob"] for t in e["top"]], np.exp(lp[want_top]), atol=1e-5)
            assert e["target_prob"] == pytest.approx(float(np.exp(lp[11])), abs=1e-5)
            assert e["target_rank"] == 1 + int((lp > lp[11]).sum())
    # the last layer's lens is the model's next-token distribution
    top = lens["layers"][-1]["positions"][0]["top"]
    np.testing.assert_allclose([t["prob"] for t in top], np.exp(last[[t["id"] for t in top]]), rtol=1e-5)


def test_lens_cli_and_errors(demo, tmp_path):
    out = tmp_path / "lens.json"
    cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--lens", out,
        "--lens-positions", "-1,3", "--lens-top-k", "3")
    j = json.loads(out.read_text())
    demo.clear_interventions()
    demo.run(PROMPT)
    want = demo.lens(positions=[-1, 3], top_k=3)
    assert j["target"] == want["target"] and len(j["layers"]) == demo.layers
    for a, b in zip(j["layers"], want["layers"]):
        assert [[t["id"] for t in p["top"]] for p in a["positions"]] == [[t["id"] for t in p["top"]] for p in b["positions"]]
        assert [np.float32(p["target_prob"]) for p in a["positions"]] == [np.float32(p["target_prob"]) for p in b["positions"]]
    for kw, needle in [(dict(positions=[10 ** 6]), "position"), (dict(layers=[99]), "does not exist"),
                       (dict(top_k=0), "top-k"), (dict(target=10 ** 7), "vocabulary")]:
        with pytest.raises(diffscope.Error, match=needle):
            demo.lens(**kw)
    bad = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--lens", out, "--lens-positions", "999",
              check=False)
    assert bad.returncode == 2 and "--lens" in bad.stderr and bad.stderr.count("\n") == 1


# ---------------------------------------------------------------------------------------------------------------
# Activation outliers (Table 5) against the reference's hidden states and attention logits.
def _summary(values):
    a = np.sort(np.abs(np.asarray(values, dtype=np.float64).ravel()))[::-1]
    top = [a[r - 1] if r <= a.size else None for r in (1, 2, 3, 10, 100)]
    return top, float(np.median(a))


def _close(got, want, rtol=2e-4):
    for g, w in zip(got, want):
        assert (g is None and w is None) or g == pytest.approx(w, rel=rtol, abs=1e-5), (got, want)


@pytest.mark.parametrize("fixture", REF_FIXTURES[:1], ids=lambda p: p.name)
def test_outliers_match_the_reference(fixture, tmp_path):
    ids = list(range(3, 40))
    with diffscope.open(fixture, backend="cpu", threads=2) as s:
        s.run(ids)
        lam = _layer_lambdas(s)
        o = s.outliers()
        assert s.outliers(logits=False)["layers"][0]["hidden_top"] == o["layers"][0]["hidden_top"]
        assert "logit_top1" not in s.outliers(logits=False)["layers"][0]
    scores = {}
    _, hidden, _ = diffllama_ref.forward(fixture, ids, lambdas=lam, scores=scores)
    n = len(ids)
    causal = np.tril(np.ones((n, n), dtype=bool))
    all_h, all_1, all_2 = [], [], []
    for l, lo in enumerate(o["layers"]):
        assert lo["layer"] == l
        top, med = _summary(hidden[l + 1])
        _close(lo["hidden_top"], top)
        assert lo["hidden_median"] == pytest.approx(med, rel=2e-4, abs=1e-6)
        Hv = scores[l].shape[0] // 2
        for key, part, pool in (("1", scores[l][:Hv], all_1), ("2", scores[l][Hv:], all_2)):
            cells = part[:, causal]
            top, med = _summary(cells)
            _close(lo["logit_top" + key], top)
            assert lo["logit_median" + key] == pytest.approx(med, rel=2e-4, abs=1e-6)
            pool.append(cells.ravel())
        all_h.append(hidden[l + 1].ravel())
    for key, pool in (("hidden", all_h), ("1", all_1), ("2", all_2)):
        top, med = _summary(np.concatenate(pool))
        name_top, name_med = ("hidden_top", "hidden_median") if key == "hidden" else ("logit_top" + key, "logit_median" + key)
        _close(o["model"][name_top], top)
        assert o["model"][name_med] == pytest.approx(med, rel=2e-4, abs=1e-6)
    out = tmp_path / "o.json"
    cli("--model", fixture, "--token-ids-file", _ids_file(tmp_path, ids), "--backend", "cpu", "--threads", "2",
        "--outliers", out)
    assert json.loads(out.read_text()) == o  # the CLI writes the same numbers


def test_outlier_top_equals_the_max_reader():
    """The radix passes and the Table 5 reader (watch_max_abs_hidden) read the same stream: each layer's largest
    |hidden state| is the same float (the CUDA backend's twin of this test is in test_cuda.py)."""
    with diffscope.open(DEMO, backend="cpu", threads=2) as d:
        d.watch_max_abs_hidden(True)
        d.run(PROMPT * 3)
        o = d.outliers(logits=False)
        mx = d.max_abs_hidden()
        assert [lo["hidden_top"][0] for lo in o["layers"]] == [float(x) for x in mx]


def test_outliers_plain_model_and_long_rows():
    with diffscope.open(TWIN, backend="cpu", threads=2) as t:
        t.run(PROMPT)
        o = t.outliers()
        assert "logit_top2" not in o["layers"][0] and "logit_top1" in o["layers"][0]
        assert all(x is not None for x in o["model"]["logit_top1"])
    with diffscope.open(DEMO, backend="cpu", threads=2) as d:  # more than 100 values per set; the last layer's rows
        d.run(PROMPT)
        a = d.outliers(logits=False)
        d.run(PROMPT, all_logits=True)  # every row already there: the same numbers
        assert d.outliers(logits=False) == a
        assert a["layers"][-1]["hidden_top"][0] >= a["layers"][-1]["hidden_top"][4] > 0


def test_scan_outliers_merge_the_prompts(tmp_path):
    """diffscope.scan(outliers=True) and diffscope-scan --outliers: the corpus's top values are those of the union of
    every prompt's values (each prompt's 100 largest, exact), its medians the median of the prompts' medians."""
    src = Path(DEMO).parents[2] / "tests" / "demo_eval_prompts.jsonl"
    rows = [json.loads(x) for x in src.read_text().splitlines()[:3]]
    lines = [json.dumps({"text": r["prompt"], "answer": r["span"]}) for r in rows]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    rep = diffscope.scan(DEMO, corpus, backend="cpu", threads=2, outliers=True, compare=TWIN)
    got, got_twin = rep.run.outliers, rep.compare.outliers
    assert got["medians"] == "median of the prompts' medians" and "logit_top2" in got["model"]
    assert "logit_top2" not in got_twin["model"] and "logit_top1" in got_twin["model"]
    per = []
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        for line in lines:
            s.run(json.loads(line)["text"])
            per.append(s.outliers())
    for key in ("hidden", "logit_top1"):
        top_key, med_key = ("hidden_top", "hidden_median") if key == "hidden" else ("logit_top1", "logit_median1")
        for l in range(len(got["layers"])):
            tops = [p["layers"][l][top_key][0] for p in per]
            assert got["layers"][l][top_key][0] == max(tops)
            assert got["layers"][l][med_key] == pytest.approx(float(np.median([p["layers"][l][med_key] for p in per])),
                                                              rel=1e-6)
        assert got["model"][top_key][0] == max(p["model"][top_key][0] for p in per)
    out = tmp_path / "r.json"
    exe = Path(os.environ.get("DS_BINARY_DIR", "build")) / "diffscope-scan"
    if not exe.exists():
        pytest.skip(f"{exe} is not built")
    subprocess.run([str(exe), "--model", DEMO, "--compare-model", TWIN, "--input", corpus, "--out", out, "--backend",
                    "cpu", "--threads", "2", "--outliers", "--no-progress"], check=True, capture_output=True)
    j = json.loads(out.read_text())
    assert j["outliers"] == got and j["compare"]["outliers"] == got_twin


@pytest.mark.parametrize("fixture", REF_FIXTURES, ids=lambda p: p.name)
def test_mean_ablation_matches_the_reference(fixture):
    """A head's output replaced by its mean over the prompt's positions; a decoding step writes the prompt's mean."""
    ids = list(range(3, 40))
    with diffscope.open(fixture, backend="cpu", threads=2) as s:
        L, H = s.layers, s.heads
        lam = _layer_lambdas(s)
        s.ablate(1, 2, "mean")
        s.ablate(L - 1, 0, "mean")
        s.run(ids, all_logits=True)
        got = s.logits(True).copy()
        assert [x["mode"] for x in s.interventions] == ["mean", "mean"]
        imp = s.head_importance(modes=("mean",))
        # already mean-ablated: ablating it again changes nothing but the order of float sums (the base log p comes
        # from the every-row run above, the ablation's from a run whose LM head takes the last row alone; OpenBLAS
        # picks its kernels by shape and CPU, and on some CPUs the two differ by an ulp of the logits)
        assert abs(imp["modes"]["mean"][1, 2]) < 1e-5
        assert np.nanmax(np.abs(imp["modes"]["mean"])) > 1e-3  # while the heads not yet ablated do change it
        assert s.interventions == [{"kind": "ablate", "mode": "mean", "layer": 1, "head": 2},
                                   {"kind": "ablate", "mode": "mean", "layer": L - 1, "head": 0}]
        step = [t.id for t in s.generate(1, stop_at_eos=False)]
        after = s.logprobs().copy()  # the next token's after one decoding step under the prompt's means
    want, _, _ = diffllama_ref.forward(fixture, ids, lambdas=lam, head_mean={(1, 2): len(ids), (L - 1, 0): len(ids)})
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert step[0] == int(np.argmax(want[-1]))
    want2, _, _ = diffllama_ref.forward(fixture, ids + step, lambdas=lam,
                                        head_mean={(1, 2): len(ids), (L - 1, 0): len(ids)})
    lp = want2[-1] - want2[-1].max()
    lp = lp - np.log(np.exp(lp).sum())
    np.testing.assert_allclose(after, lp, atol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# The quantisation what-if (Figure 8): logits fake-quantised per row and head before the softmax.
def _no_midpoint_ids(fixture, lam, bits):
    """A prompt none of whose quantised logits lies within float32 rounding of a step's midpoint (the engine sums its
    dot products in another order, so such a logit may round either way, equally right): the first of a few
    candidate id sequences for which the reference finds none."""
    for start in range(3, 120, 4):
        ids = list(range(start, start + 14))  # short: fewer logits, so that some prompt has none at a midpoint
        scores = {}
        diffllama_ref.forward(fixture, ids, lambdas=lam, logit_bits=bits, scores=scores)
        n = len(ids)
        causal = np.tril(np.ones((n, n), dtype=bool))
        near = False
        for sc in scores.values():
            s32 = sc.astype(np.float32)
            step = np.where(causal[None], np.abs(s32), 0).max(-1, keepdims=True) / np.float32((1 << (bits - 1)) - 1)
            frac = s32 / step - np.floor(s32 / step)
            near |= bool(((np.abs(frac - 0.5) < 2e-4) & causal[None]).any())  # |engine - reference| / step ~1e-4
        if not near:
            return ids
    raise AssertionError("no candidate prompt without a logit at a rounding midpoint")


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("fixture", REF_FIXTURES, ids=lambda p: p.name)
def test_quantised_logits_match_the_reference(fixture, bits):
    with diffscope.open(fixture, backend="cpu", threads=2) as s:
        lam = _layer_lambdas(s)
        ids = _no_midpoint_ids(fixture, lam, bits)
        s.run(ids, all_logits=True)
        full = s.logits(True).copy()
        s.set_logit_bits(bits)
        assert s.logit_bits == bits and s.stale_from == 0
        s.run(all_logits=True)
        got = s.logits(True).copy()
        maps = s.maps(1)
        s.set_logit_bits(None)
        s.run(all_logits=True)
        np.testing.assert_array_equal(s.logits(True), full)  # reversible
    want, _, ref_maps = diffllama_ref.forward(fixture, ids, lambdas=lam, logit_bits=bits)
    assert np.abs(want - full).max() > 1e-3  # quantisation matters at these bits
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(maps.a1, ref_maps[1][0], atol=1e-5)  # the maps are the quantised model's
    np.testing.assert_allclose(maps.a2, ref_maps[1][1], atol=1e-5)


def test_quantize_report_and_errors(tmp_path):
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        s.run(PROMPT)
        base = s.logprobs().copy()
        r16, r4 = s.quantize_report(16), s.quantize_report(4)
        assert s.logit_bits == 0 and np.array_equal(s.logprobs(), base)  # the session's setting is kept
        assert 0 <= r16["kl"] < 1e-4 and r4["kl"] > r16["kl"] and r4["max_diff_change"] > r16["max_diff_change"]
        s.set_logit_bits(4)
        s.run()
        q = s.logprobs()
        p = base
        assert r4["kl"] == pytest.approx(float(np.sum(np.exp(p) * (p - q))), rel=1e-3, abs=1e-7)
        assert r4["top_quantised"] == int(np.argmax(q)) and r4["top_full"] == int(np.argmax(p))
        # generation under quantisation (decoding steps, each row quantised against its own largest logit): each token
        # the greedy choice of a full quantised forward of the sequence so far, and the last step's distribution that
        # forward's
        s.run(PROMPT)
        n0 = s.n
        gen = [t.id for t in s.generate(4, stop_at_eos=False)]
        seq = list(s.ids)
        for i, tok in enumerate(gen):
            s.run(seq[:n0 + i])
            assert s.top_k(1)[0].id == tok, i
        s.run(seq)
        full = s.logprobs().copy()
        s.run(seq[:n0])
        list(s.generate(4, stop_at_eos=False))
        np.testing.assert_allclose(s.logprobs(), full, atol=2e-4)  # the last step's distribution, as the forward's
        for bad in (1, 17, -3):
            with pytest.raises(diffscope.Error, match="outside 2..16"):
                s.set_logit_bits(bad)
        with pytest.raises(diffscope.Error, match="outside 2..16"):
            s.quantize_report(20)
    out = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--quantize-logits", "4",
              "--top-k", "3", "--json")
    j = json.loads(out.stdout)
    assert j["quantization"]["bits"] == 4 and j["quantization"]["kl"] == pytest.approx(r4["kl"], rel=1e-5)
    assert j["top_k"][0]["id"] == r4["top_quantised"]
    bad = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--quantize-logits", "1", check=False)
    assert bad.returncode == 2 and "outside 2..16" in bad.stderr


def test_scan_under_quantisation(tmp_path):
    """diffscope.scan(logit_bits=) / diffscope-scan --quantize-logits: every prompt runs quantised; the greedy answer
    is the session's under the same setting."""
    src = Path(DEMO).parents[2] / "tests" / "demo_eval_prompts.jsonl"
    rows = [json.loads(x) for x in src.read_text().splitlines()[:2]]
    lines = [json.dumps({"text": r["prompt"], "answer": r["span"], "target": r["answer"]}) for r in rows]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    rep = diffscope.scan(DEMO, corpus, backend="cpu", threads=2, logit_bits=4, max_answer_tokens=4)
    assert rep.run.logit_bits == 4 and rep.run.with_target == 2
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        s.set_logit_bits(4)
        for r, pp in zip(rows, rep.run.per_prompt):
            s.run(r["prompt"])
            out = "".join(t.text for t in s.generate(4, stop_at_eos=True))
            assert pp["output"] == out[:len(pp["output"])] and len(pp["output"]) > 0
            s.clear_generation()
    exe = Path(os.environ.get("DS_BINARY_DIR", "build")) / "diffscope-scan"
    if not exe.exists():
        pytest.skip(f"{exe} is not built")
    out = tmp_path / "r.json"
    subprocess.run([str(exe), "--model", DEMO, "--input", corpus, "--out", out, "--backend", "cpu", "--threads", "2",
                    "--quantize-logits", "4", "--max-answer-tokens", "4", "--no-progress"], check=True, capture_output=True)
    j = json.loads(out.read_text())
    assert j["logit_bits"] == 4 and j["correct"] == rep.run.correct
    assert [p["output"] for p in j["per_prompt"]] == [p["output"] for p in rep.run.per_prompt]
