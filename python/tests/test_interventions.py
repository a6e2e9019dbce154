"""Head interventions (the one forward's HeadOut writer): a head's output scaled or zeroed equals, on every family,
a forward of a copy of the checkpoint whose o_proj columns of that head are scaled the same way (an independent
construction of the same function); the CLI's --ablate / --scale-head give the same bits as the module."""
import json
import shutil
import struct

import numpy as np
import pytest

import diffscope
from conftest import DEMO, cli, cuda_or_skip, fixture_dirs

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
    assert demo.interventions == [{"layer": 2, "head": 1, "kind": "scale", "factor": 0.0},
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
                      (lambda: demo.ablate(0, 0, mode="a2"), "not available"),
                      (lambda: demo.scale_head(0, 0, float("nan")), "finite")]:
        with pytest.raises(diffscope.Error, match=needle):
            f()
    assert demo.interventions == []


def test_interventions_apply_to_generation(demo):
    """The decoding steps carry the writer: each generated token is the greedy choice of a full forward of the
    sequence so far under the same intervention."""
    demo.clear_interventions()
    for h in range(demo.heads):
        demo.ablate(3, h)
    demo.run(PROMPT)
    n0 = demo.n
    got = [t.id for t in demo.generate(5, stop_at_eos=False)]
    seq = list(demo.ids)
    for i, tok in enumerate(got):
        demo.run(seq[:n0 + i])
        assert demo.top_k(1)[0].id == tok, i
    demo.clear_interventions()
    demo.run(seq[:n0])
    demo.clear_generation()


def test_cli_ablate_bit_for_bit(tmp_path):
    p = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--ablate", "3.1",
            "--scale-head", "5.2=0.25", "--ablate", "1.0:head", "--top-k", "6", "--json")
    want = json.loads(p.stdout)
    assert want["interventions"] == [{"layer": 3, "head": 1, "kind": "scale", "factor": 0.0},
                                     {"layer": 5, "head": 2, "kind": "scale", "factor": 0.25},
                                     {"layer": 1, "head": 0, "kind": "scale", "factor": 0.0}]
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        s.ablate(3, 1)
        s.scale_head(5, 2, 0.25)
        s.ablate(1, 0)
        s.run(PROMPT)
        assert [(t.id, np.float32(t.prob)) for t in s.top_k(6)] == [(t["id"], np.float32(t["prob"])) for t in want["top_k"]]
    bad = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--ablate", "3.9", check=False)
    assert bad.returncode == 2 and "head 9" in bad.stderr and bad.stderr.count("\n") == 1
    bad = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--ablate", "3.1:a2", check=False)
    assert bad.returncode == 2 and "not available" in bad.stderr


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
        "--importance-target", "953")
    j = json.loads(out.read_text())
    demo.clear_interventions()
    demo.run(PROMPT)
    imp = demo.head_importance(target=953)
    assert j["target"] == 953 and j["complete"] and j["layers"] == imp["layers"]
    assert np.array_equal(np.array(j["modes"]["head"]), imp["modes"]["head"])
    assert j["base_logp"] == imp["base_logp"]
    with pytest.raises(diffscope.Error, match="not available"):
        demo.head_importance(modes=("a1",))
    with pytest.raises(diffscope.Error, match="vocabulary"):
        demo.head_importance(target=10 ** 6)
    bad = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--importance", out, "--importance-target",
              "99999999", check=False)
    assert bad.returncode == 2 and "--importance" in bad.stderr
