"""The module's behaviour: arrays without copies, lambda and re-runs, generation, scans, the profiler, readers."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import diffscope
from conftest import BUILD, DEMO, ROOT, TWIN, fixture_dirs

PROMPT = "records: 7274 -> ocean; 1505 -> nectar; 1104 -> lemon. question: 1505 ->"


def test_arrays_are_the_engines_buffers(demo):
    demo.run(PROMPT)
    v = demo.view(3, 1, grid=(16, 16))
    for k in ("a1", "a2", "diff"):
        a = getattr(v, k)
        assert a.dtype == np.float32 and a.flags.c_contiguous
        assert a.ctypes.data == v._engine_address(k), k  # the grid the engine wrote, not a copy
        assert getattr(v, k).ctypes.data == a.ctypes.data  # every access: the same memory
    a1 = v.a1
    a1[0, 0] = 123.0
    assert v.a1[0, 0] == 123.0  # shared, not copied
    del v
    assert a1[0, 0] == 123.0  # the array keeps the buffer alive after its View is gone
    r = demo.rows([-1, 0])
    assert r.a1.ctypes.data == r._engine_address("a1") and r.a2.ctypes.data == r._engine_address("a2")
    m = demo.maps(2)
    assert m.a1.ctypes.data == m._engine_address("a1")
    ids = demo.ids
    assert ids.dtype == np.int32 and ids.flags.owndata is False  # owned by a capsule, not a NumPy copy


def test_view_rows_shapes_and_consistency(demo):
    demo.run(PROMPT)
    n = demo.n
    full = demo.view(2, 0, grid=(n, n))  # a small map comes back exact
    m = demo.maps(2)
    assert full.grid == (n, n) and full.rect == (0, n, 0, n)
    np.testing.assert_allclose(full.a1, m.a1[0], atol=1e-6)
    np.testing.assert_allclose(full.diff, m.a1[0] - full.lambda_ * m.a2[0], atol=1e-6)
    np.testing.assert_allclose(m.diff, m.a1 - m.lambda_ * m.a2, atol=1e-7)
    r = demo.rows(-1, layers=[2])
    assert r.a1.shape == (1, demo.heads, 1, n) and list(r.positions) == [n - 1]
    np.testing.assert_array_equal(r.a1[0, :, 0], m.a1[:, n - 1])
    np.testing.assert_allclose(r.a1.sum(-1), 1.0, atol=1e-5)  # a softmax row
    # a lambda for the view alone needs no new forward
    v0 = demo.view(2, 0, grid=(n, n), lambda_=0.0)
    np.testing.assert_array_equal(v0.diff, v0.a1)
    assert demo.stale_from == demo.layers


def test_lambda_rerun_and_reset(demo):
    demo.run(PROMPT)
    base = demo.logprobs().copy()
    assert demo.lambdas.override == [None] * demo.layers
    demo.set_lambda(4, 0.0)
    assert demo.stale_from == 4
    demo.run()
    assert demo.last_run_from == 4
    changed = demo.logprobs()
    assert not np.array_equal(changed, base)
    assert demo.lambdas.effective[4] == 0.0 and demo.lambdas.override[4] == 0.0
    demo.lambda_scale = 0.5
    assert demo.lambda_scale == 0.5
    np.testing.assert_allclose(demo.lambdas.effective[:4], 0.5 * demo.lambdas.model[:4])
    demo.reset_lambda()
    demo.run()
    np.testing.assert_array_equal(demo.logprobs(), base)
    lp_all = demo.logprobs(all_positions=True)
    assert lp_all.shape == (demo.n, demo.config["vocab"])
    np.testing.assert_allclose(lp_all[-1], base, atol=1e-5)
    np.testing.assert_allclose(np.exp(lp_all).sum(-1), 1.0, atol=1e-4)


def test_tokens_and_top_k(demo):
    demo.run(PROMPT)
    toks = demo.tokens
    assert [t.id for t in toks] == list(demo.ids)
    raw = PROMPT.encode()
    for t in toks:
        if not t.special:
            assert 0 <= t.begin < t.end <= len(raw)
    top = demo.top_k(5)
    assert len(top) == 5 and top[0].prob >= top[1].prob
    lp = demo.logprobs()
    assert top[0].id == int(np.argmax(lp))
    np.testing.assert_allclose(np.log(top[0].prob), lp[top[0].id], atol=1e-5)
    assert demo.decode(demo.encode("hello world", add_special=False)) == "hello world"


def test_generate_is_a_stoppable_iterator(demo):
    demo.run(PROMPT)
    n0 = demo.n
    got = []
    for t in demo.generate(50, stop_at_eos=False):
        got.append(t.id)
        if len(got) == 3:
            break
    assert len(got) == 3 and demo.generated == got and demo.n == n0 + 3
    assert demo.stop_reason == "stopped"
    # the sequence covers what was generated: rows of the last generated position
    assert demo.rows(-1).a1.shape[-1] == n0 + 3
    demo.clear_generation()
    assert demo.n == n0 and demo.generated == []
    full = [t.id for t in demo.generate(5, stop_at_eos=False)]
    assert full[:3] == got  # greedy: the same continuation
    assert demo.stop_reason == "max_tokens"


def test_profile_and_max_abs_hidden(demo):
    demo.watch_max_abs_hidden(True)
    demo.run(PROMPT)
    p = demo.profile()
    assert p["tokens"] == demo.n and p["forward_ms"] > 0
    assert any(k["name"] == "attention" for k in p["kernels"])
    assert len(p["head_ms"]) == len(p["head_layer"]) == len(p["head_head"])
    mah = demo.max_abs_hidden()
    assert mah.shape == (demo.layers,) and np.all(mah > 0)
    demo.watch_max_abs_hidden(False)
    with pytest.raises(diffscope.Error, match="reader is off"):
        demo.max_abs_hidden()


def test_stats_records_for_pandas(demo):
    demo.run(PROMPT)
    st = demo.stats()
    recs = st.to_records()
    assert len(recs) == len(st.layers) * st.heads
    assert set(recs[0]) >= {"layer", "head", "entropy_diff", "max_logit2", "lambda"}
    assert st["entropy1"].shape == (len(st.layers), st.heads)
    with pytest.raises(KeyError):
        st["nope"]
    # the statistics of D under another lambda, without a new forward
    st0 = demo.stats(layers=[3], lambda_=0.0)
    np.testing.assert_allclose(st0["first_diff"], st0["first1"], atol=1e-6)


def test_twin_has_one_map():
    with diffscope.open(TWIN, backend="cpu", threads=2) as s:
        s.run(PROMPT)
        assert not s.differential
        v = s.view(1, 0)
        assert v.a2 is None and np.array_equal(v.a1, v.diff)
        assert s.rows(-1).a2 is None
        assert "entropy2" not in s.stats()
        with pytest.raises(diffscope.Error, match="differential"):
            s.set_lambda(1, 0.3)


def test_hybrid_mamba_view():
    fx = fixture_dirs(lambda c: c.get("model_type") == "phi4flash")[0]
    with diffscope.open(fx, backend="cpu", threads=2) as s:
        s.run(list(range(3, 40)))
        kinds = s.layer_kinds
        mamba = kinds.index("mamba") if "mamba" in kinds else kinds.index("memory")
        v = s.mamba_view(mamba, 3, grid=(37, 37))
        row = s.mamba_row(mamba, 3, -1)
        assert row.shape == (37,)
        np.testing.assert_allclose(v.a1[-1], row, rtol=1e-5, atol=1e-7)
        assert v.a2 is None
        with pytest.raises(diffscope.Error, match="mamba_view"):
            s.view(mamba, 0)
        with pytest.raises(diffscope.Error):
            s.mamba_view(s.map_layers[0], 0)


def _small_corpus(tmp_path, n=3):
    lines = (ROOT / "assets/models/report/needles.jsonl").read_text().splitlines()
    short = sorted(lines, key=len)[:n]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(short + ["{not json", ""]) + "\n")
    return path, [json.loads(l) for l in short]


def test_scan_equals_diffscope_scan(tmp_path):
    corpus, prompts = _small_corpus(tmp_path)
    exe = BUILD / "diffscope-scan"
    if not exe.exists():
        pytest.skip(f"{exe} is not built")
    out = tmp_path / "r.json"
    subprocess.run([str(exe), "--model", str(DEMO), "--compare-model", str(TWIN), "--input", str(corpus), "--out",
                    str(out), "--backend", "cpu", "--threads", "2"], check=True, capture_output=True)
    want = json.loads(out.read_text())
    seen = []
    r = diffscope.scan(DEMO, corpus, compare=TWIN, backend="cpu", threads=2, progress=lambda d, t: seen.append((d, t)))
    got = r.to_dict()

    def strip(d):  # wall times differ
        d = json.loads(json.dumps(d))
        d.pop("elapsed_s", None)
        for run in (d, d.get("compare", {})):
            for p in run.get("per_prompt", []):
                p.pop("ms", None)
        return d

    assert strip(got) == strip(want)
    assert r.complete and r.run.prompts == len(prompts) and r.compare.label == "llama-demo"
    assert len(r.skipped) == 1 and r.skipped[0]["line"] == len(prompts) + 1
    assert seen[-1] == (len(prompts), len(prompts))
    assert len(r.to_records()) == sum(len(l["heads"]) for run in (r.run, r.compare) for l in run.layers)
    # the same prompts as dicts give the same numbers
    r2 = diffscope.scan(DEMO, prompts, backend="cpu", threads=2)
    assert r2.run.mean == r.run.mean and r2.input == "<python>"


def test_scan_on_two_replicas_equals_one_backend(tmp_path):
    """backend="cpu,cpu": two CPU backends stand in for two GPUs, the prompts going to whichever is free; the report
    is one backend's (the same threads each), progress counts every prompt, and Sessions are refused."""
    corpus, prompts = _small_corpus(tmp_path)
    one = diffscope.scan(DEMO, corpus, compare=TWIN, backend="cpu", threads=1, outliers=True).to_dict()
    seen = []
    two = diffscope.scan(DEMO, corpus, compare=TWIN, backend="cpu,cpu", threads=1, outliers=True,
                         progress=lambda d, t: seen.append((d, t))).to_dict()
    for d in (one, two):
        d.pop("elapsed_s")
        for run in (d, d["compare"]):
            for p in run["per_prompt"]:
                p.pop("ms")
    assert two == one
    assert sorted(seen)[-1] == (len(prompts), len(prompts))
    three = diffscope.scan(DEMO, prompts, backend="cpu,cpu", threads=1, max_prompts=2)
    assert three.run.prompts == 2 and not three.complete and three.input == "<python>"
    with pytest.raises(diffscope.Error, match="folders"):
        diffscope.scan(diffscope.open(DEMO, backend="cpu"), corpus, backend="cpu,cpu")
    with pytest.raises(diffscope.Error, match="cpu,2"):
        diffscope.scan(DEMO, corpus, backend="cpu,2")


def test_layer_split_equals_one_backend():
    """backend="cpu,cpu" with gpu_mem_limit: the demo model split over two CPU backends (standing in for two GPUs)
    gives one backend's logits, views, rows, lens and generation bit for bit; a limit nothing fits is one line."""
    one = diffscope.open(DEMO, backend="cpu", threads=1)
    two = diffscope.open(DEMO, backend="cpu,cpu", threads=1, gpu_mem_limit="80M")
    assert "layer split: layers 0-" in two.backend
    ids = np.arange(60, dtype=np.int32) * 37 % 7000 + 20
    for s in (one, two):
        s.run(ids)
    assert np.array_equal(one.logits(), two.logits())
    for layer in range(one.config["layers"]):
        assert np.array_equal(one.view(layer, 1, grid=(32, 32)).diff, two.view(layer, 1, grid=(32, 32)).diff)
    assert np.array_equal(one.rows([-1, 7]).a1, two.rows([-1, 7]).a1)
    lanes = two.profile()["lanes"]  # a lane per device, in layer order; one backend has none
    assert [x["device"] for x in lanes] == ["CPU 0", "CPU 1"] and one.profile()["lanes"] == []
    assert lanes[0]["end_layer"] == lanes[1]["first_layer"] and lanes[1]["start_ms"] >= lanes[0]["end_ms"] - 1e-6
    for s in (one, two):
        s.set_lambda(one.config["layers"] - 1, 0.25)
        s.run()
    assert np.array_equal(one.logits(), two.logits())
    lanes = two.profile()["lanes"]  # the last layer's change re-ran the second block alone
    assert lanes[0]["end_ms"] == lanes[0]["start_ms"] and lanes[1]["end_ms"] > lanes[1]["start_ms"]
    assert one.lens(positions=[-1]) == two.lens(positions=[-1])
    assert [t.id for t in one.generate(4)] == [t.id for t in two.generate(4)]
    with pytest.raises(diffscope.Error, match="does not fit the 2 devices"):
        diffscope.open(DEMO, backend="cpu,cpu", gpu_mem_limit="1M")
    with pytest.raises(diffscope.Error, match="gpu_mem_limit"):
        diffscope.open(DEMO, backend="cpu,cpu", gpu_mem_limit="lots")
    with pytest.raises(diffscope.Error, match="plan_tokens"):
        diffscope.open(DEMO, backend="cpu,cpu", gpu_mem_limit="80M", plan_tokens=-1)


def _interrupted_child(code, too_fast):
    """Runs `code` (which signals itself) in a child process; exit 3 means the work finished before the signal (a skip,
    with `too_fast` as the reason); returns its stdout after checking it succeeded."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    if p.returncode == 3:
        pytest.skip(too_fast + ": " + p.stdout)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_keyboard_interrupt_stops_the_outlier_statistics_between_layers():
    """Ctrl-C while Session.outliers() recomputes every layer's attention logits (seconds at 4000 tokens on a CPU):
    KeyboardInterrupt, and the session's statistics afterwards are a fresh session's (that the engine stops between
    layers is the C++ test's OutlierStats.CancelStopsBetweenLayersAndTheSessionStaysAsItWas, and cli.outliers_sigint
    sees nothing written). A child process, so that the signal reaches only it."""
    code = f"""
import os, signal, threading, time, sys
import numpy as np, diffscope
s = diffscope.open({str(DEMO)!r}, backend="cpu", threads=2)
ids = np.arange(100, 100 + 4000, dtype=np.int32) % 4000 + 10
s.run(ids)
def kill():
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=kill).start()
try:
    s.outliers()
    print("finished before the signal")
    sys.exit(3)
except KeyboardInterrupt:
    print("interrupted")
a = s.outliers(logits=False)
with diffscope.open({str(DEMO)!r}, backend="cpu", threads=2) as f:
    f.run(ids)
    assert a == f.outliers(logits=False)
print("usable")
"""
    out = _interrupted_child(code, "the outlier statistics of 4000 tokens finished before the signal (a fast machine)")
    assert "interrupted" in out and "usable" in out


def test_keyboard_interrupt_returns_the_head_importance_measured_so_far():
    """Ctrl-C during Session.head_importance(): what was measured comes back (complete=False, NaN where not measured)
    with a warning, not a KeyboardInterrupt, as its docstring says (and the CLI's partial file). A child process."""
    code = f"""
import os, signal, threading, time, sys, warnings
import numpy as np, diffscope
s = diffscope.open({str(DEMO)!r}, backend="cpu", threads=2)
ids = np.arange(100, 100 + 3000, dtype=np.int32) % 4000 + 10
s.run(ids)
t0 = time.time()
s.head_importance(modes=["head"])  # (how long the whole takes here: the signal comes at a third of it)
whole = time.time() - t0
def kill():
    time.sleep(whole / 3)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=kill).start()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    r = s.head_importance(modes=["head"])
if r["complete"]:
    print("finished before the signal")
    sys.exit(3)
d = r["modes"]["head"]
assert 0 < r["done"] < r["total"] and np.isnan(d).sum() == r["total"] - r["done"], (r["done"], r["total"])
assert any("interrupted" in str(x.message) for x in w)
s.run()
print("partial", r["done"], "of", r["total"])
"""
    out = _interrupted_child(code, "the head importance of 3000 tokens finished before the signal (a fast machine)")
    assert "partial" in out


def test_keyboard_interrupt_stops_a_run_and_leaves_the_session_usable(tmp_path):
    """Ctrl-C (SIGINT to this process) during a long forward: KeyboardInterrupt, then the same session runs again
    and gives what a fresh session gives. Run in a child process so that the signal reaches only it."""
    code = f"""
import os, signal, threading, time, sys
import numpy as np, diffscope
s = diffscope.open({str(DEMO)!r}, backend="cpu", threads=2)
ids = np.arange(100, 100 + 8000, dtype=np.int32) % 4000 + 10
s.run(ids[:64])
def kill():
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=kill).start()
t = time.time()
try:
    s.run(ids)
    print("finished before the signal", time.time() - t)
    sys.exit(3)
except KeyboardInterrupt:
    print("interrupted after", round(time.time() - t, 2), "s")
s.run(ids[:200])
a = s.logprobs().copy()
with diffscope.open({str(DEMO)!r}, backend="cpu", threads=2) as f:
    f.run(ids[:200])
    assert np.array_equal(a, f.logprobs())
print("usable")
"""
    out = _interrupted_child(code, "the 8000-token forward finished before the signal (a fast machine)")
    assert "interrupted after" in out and "usable" in out


def test_threads_share_a_session_safely(demo):
    """The GIL is released during engine work: two threads on one session take turns (the session's lock)."""
    demo.run(PROMPT)
    want = demo.view(3, 0, grid=(8, 8)).diff.copy()
    errors = []

    def work():
        try:
            for _ in range(20):
                assert np.array_equal(demo.view(3, 0, grid=(8, 8)).diff, want)
                demo.stats(layers=[1])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_type_stubs_are_current(tmp_path):
    """python/diffscope/_diffscope.pyi is what nanobind's stubgen makes of the built module (regenerate it with
    `python -m nanobind.stubgen -m diffscope._diffscope -o python/diffscope/_diffscope.pyi`)."""
    stubgen = pytest.importorskip("nanobind.stubgen")
    out = tmp_path / "_diffscope.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "diffscope._diffscope", "-o", str(out)],
                   check=True, env=os.environ)
    assert out.read_text() == (ROOT / "python/diffscope/_diffscope.pyi").read_text()
    assert "Session.view" in diffscope.View.__doc__ and "rect" in diffscope.Session.view.__doc__


def test_rows_diff_and_token_range(demo):
    text = "records: 7274 -> océan; 1505 -> nectar. question: 1505 ->"
    demo.run(text)
    r = demo.rows(-1)
    np.testing.assert_allclose(r.diff, r.a1 - r.lambda_[:, None, None, None] * r.a2, atol=1e-7)
    assert r.lambda_[2] == np.float32(demo.lambdas.effective[r.layers[2]])
    b = text.index("nectar")
    t0, t1 = demo.token_range(b, b + len("nectar"))
    assert "nectar" in "".join(t.text for t in demo.tokens[t0:t1]).replace(" ", "")
    b = text.index("océan")  # a character offset past a 2-byte character
    t0, t1 = demo.token_range(b, b + 5)
    assert "oc" in "".join(t.text for t in demo.tokens[t0:t1])
    with pytest.raises(diffscope.Error, match="token_range"):
        demo.token_range(5, 5)


def test_keyboard_interrupt_keeps_a_scans_work(tmp_path):
    """Ctrl-C during diffscope.scan: the report of the prompts scanned so far comes back, marked incomplete."""
    code = f"""
import os, signal, threading, time, warnings, sys
import diffscope
done = []
def progress(d, t):
    done.append(d)
    if d == 2:  # two prompts in: Ctrl-C
        os.kill(os.getpid(), signal.SIGINT)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    r = diffscope.scan({str(DEMO)!r}, {str(ROOT / "assets/models/report/needles.jsonl")!r}, backend="cpu",
                       threads=2, progress=progress)
assert not r.complete, r.complete
assert 2 <= r.run.prompts < 60, r.run.prompts
assert any("interrupted" in str(x.message) for x in w)
print("partial", r.run.prompts)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "partial" in p.stdout


def test_keyboard_interrupt_during_a_short_call_is_not_lost():
    """A Ctrl-C that arrives while the engine answers a query it cannot stop still raises KeyboardInterrupt."""
    code = f"""
import os, signal, threading, time, sys
import numpy as np, diffscope
s = diffscope.open({str(DEMO)!r}, backend="cpu", threads=2)
s.run((np.arange(3000, dtype=np.int32) % 3000) + 10)
def kill():
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=kill).start()
try:
    for i in range(10 ** 6):  # until the signal comes, however fast the machine (no wall-clock budget)
        s.stats(layers=[3])
    print("not interrupted")
    sys.exit(3)
except KeyboardInterrupt:
    print("interrupted at call", i)
print(len(s.top_k(2)))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "interrupted at call" in p.stdout
