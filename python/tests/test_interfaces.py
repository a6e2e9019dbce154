"""One engine feature, the same answer on every road to it: a head's own lambda in rows, maps, the dump and the
quantisation report; a scan of a Session keeps its lambda scale and logit bits and records its interventions; the quantisation
report at the sequence's end in the CLI as in Python; the importance keys of the CLI file and of the Python dict; and
bad arguments from Python as one-line errors naming them."""
import json
import struct
from pathlib import Path

import numpy as np
import pytest

import diffscope
from conftest import DEMO, cli, read_safetensors

PROMPT = "records: 7274 -> ocean; 1505 -> nectar. question: 1505 ->"


def _metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def _fresh(s):
    """The module's shared session back to the model as it is (another test's edits dropped), on PROMPT."""
    s.clear_interventions()
    s.reset_lambda()
    s.set_logit_bits(None)
    s.run(PROMPT)


def test_a_heads_own_lambda_reaches_rows_maps_and_the_dump(demo, tmp_path):
    _fresh(demo)
    lam = float(demo.lambdas.effective[3])
    demo.set_head_lambda(3, 0, 0.2)
    demo.ablate(3, 1, "a2")  # lambda 0 for head 1
    demo.run()
    r = demo.rows([-1], [3])
    assert r.lambda_[0] == np.float32(lam)
    want_h = np.full(demo.heads, lam, np.float32)
    want_h[0], want_h[1] = 0.2, 0.0
    np.testing.assert_array_equal(r.head_lambda[0], want_h)
    np.testing.assert_allclose(r.diff, r.a1 - r.head_lambda[:, :, None, None] * r.a2, atol=1e-7)
    m = demo.maps(3)
    np.testing.assert_array_equal(m.head_lambda, want_h)
    np.testing.assert_allclose(m.diff, m.a1 - m.head_lambda[:, None, None] * m.a2, atol=1e-7)
    v = demo.view(3, 0, grid=(demo.n, demo.n))
    np.testing.assert_allclose(v.diff, m.diff[0], atol=1e-6)  # the view (the GUI's map) takes the same lambda
    # diffscope-run's dump: layers.L.lambda stays the layer's, layers.L.head_lambda is each head's
    dump = tmp_path / "d.safetensors"
    cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--head-lambda", "3.0=0.2",
        "--ablate", "3.1:a2", "--rows", "-1", "--dump", dump)
    t = read_safetensors(dump)
    assert t["layers.3.lambda"][0] == np.float32(lam)
    np.testing.assert_array_equal(t["layers.3.head_lambda"], want_h)
    np.testing.assert_allclose(t["layers.3.rows1"], r.a1[0], atol=1e-6)
    assert _metadata(dump)["logit_bits"] == "0"
    # the quantisation report's change of A1 - lambda A2 takes each head's lambda too
    rep = demo.quantize_report(4)
    full = demo.rows([-1])
    demo.set_logit_bits(4)
    demo.run()
    q = demo.rows([-1])
    demo.set_logit_bits(None)
    demo.run()
    assert rep["max_diff_change"] == pytest.approx(float(np.abs(q.diff - full.diff).max()), rel=1e-5)


def test_the_dump_records_the_quantisation(tmp_path):
    dump = tmp_path / "q.safetensors"
    cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--quantize-logits", "6",
        "--rows", "-1", "--dump", dump)
    assert _metadata(dump)["logit_bits"] == "6"


def test_quantize_report_at_the_sequence_end_cli_equals_python():
    out = cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--generate", "3",
              "--quantize-logits", "4", "--top-k", "1", "--json")
    j = json.loads(out.stdout)
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        s.run(PROMPT)
        list(s.generate(3))
        rep = s.quantize_report(4)
        assert rep["position"] == s.n - 1 == j["tokens"] - 1
    assert j["quantization"]["position"] == rep["position"]
    assert j["quantization"]["kl"] == pytest.approx(rep["kl"], rel=1e-3)  # (its decoding steps' rounding)
    assert j["quantization"]["top_quantised"] == j["top_k"][0]["id"]  # the same position as the top tokens


def test_scan_of_a_session_keeps_its_settings_and_records_its_interventions(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": PROMPT, "answer": [9, 15]}) + "\n")
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        s.run(PROMPT)
        s.set_logit_bits(3)
        s.lambda_scale = 0.5
        s.ablate(2, 1)
        s.knockout(1, (-1, 0), (0, 3))
        rep = diffscope.scan(s, corpus, logit_bits=4)
        assert s.logit_bits == 3 and s.lambda_scale == 0.5  # the session's own settings are back
        assert rep.run.logit_bits == 4 and rep.run.lambda_scale == 0.5  # given; left None: the session's
        assert rep.run.interventions == s.interventions and len(rep.run.interventions) == 2
        assert rep.to_dict()["interventions"] == s.interventions
        own = diffscope.scan(s, corpus)  # left None: the session's own settings
        assert own.run.logit_bits == 3 and own.run.lambda_scale == 0.5
        with pytest.raises(diffscope.Error, match="token_range"):  # its tokens are the scan's last prompt's now
            s.token_range(0, 3)
        clean = diffscope.scan(DEMO, corpus, backend="cpu", threads=2)
        assert clean.run.interventions == [] and clean.to_dict()["interventions"] == []
        with pytest.raises(diffscope.Error, match="logit_bits: 1 bits is outside 2..16"):
            diffscope.scan(s, corpus, logit_bits=1)


def test_importance_keys_cli_and_python(demo, tmp_path):
    _fresh(demo)
    h = demo.head_importance(modes=["a2"])
    out = tmp_path / "i.json"
    cli("--model", DEMO, "--prompt", PROMPT, "--backend", "cpu", "--threads", "2", "--importance", out,
        "--importance-modes", "a2")
    j = json.loads(out.read_text())
    for k in ("target", "base_logp", "layers", "heads", "complete", "done", "total"):
        assert j[k] == h[k], k
    assert j["done"] == j["total"] == len(j["layers"]) * j["heads"]
    with pytest.raises(diffscope.Error, match="'head' is given twice"):
        demo.head_importance(modes=["head", "head"])


def test_knockout_to_the_end_from_a_start(demo):
    _fresh(demo)
    n = demo.n
    demo.knockout("1:-1:,2:")  # keys 2.. to the end, as diffscope-run's spec
    assert demo.interventions[0]["keys"] == [2, None]
    demo.run()
    a = demo.logprobs().copy()
    demo.clear_interventions()
    demo.knockout(1, (-1, None), (2, None))
    assert demo.interventions[0]["keys"] == [2, None] and demo.interventions[0]["queries"] == [-1, None]
    demo.clear_interventions()
    demo.knockout(1, (-1, 0), (2, n))
    demo.run()
    np.testing.assert_array_equal(demo.logprobs(), a)
    with pytest.raises(TypeError, match="spec"):
        demo.knockout("1:-1:,2:", (0, 1), (0, 1))


def test_python_arguments_are_checked(demo):
    _fresh(demo)
    for f, name in [(lambda: demo.ablate(2, 2 ** 40), "head"), (lambda: demo.set_head_lambda(2 ** 33, 0, 0.1), "layer"),
                    (lambda: demo.knockout(2 ** 40, (0, 1), (0, 1)), "layers"),
                    (lambda: demo.head_importance(target=2 ** 40), "target"), (lambda: demo.set_logit_bits(2 ** 40), "bits"),
                    (lambda: demo.lens(top_k=2 ** 40), "top_k"), (lambda: demo.head_importance(target=-1), "target"),
                    (lambda: demo.lens(target=-1), "target"), (lambda: demo.lens(layers=[]), "layers"),
                    (lambda: demo.lens(positions=[]), "positions")]:
        with pytest.raises(diffscope.Error, match=name) as e:
            f()
        assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="logits must be a bool"):
        demo.outliers(logits="no")
    with pytest.raises(TypeError, match="device must be a bool"):
        demo.rows([-1], device="yes")
    assert demo.lens(positions=5) == demo.lens(positions=[5])


def test_a_prompt_a_knockout_does_not_fit_leaves_the_session_as_it_was():
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        s.run("The cat sat on the mat and looked at the door")
        s.knockout("all", (-1, None), (3, 5))
        s.run()
        n, top = s.n, s.top_k(1)[0].id
        with pytest.raises(diffscope.Error, match="key span 3:5 is outside the prompt's"):
            s.run("Hi")
        assert s.n == n and s.top_k(1)[0].id == top and s.maps(0).a1.shape[-1] == n
        s.clear_interventions()
        s.run("Hi")
        assert s.n < n
