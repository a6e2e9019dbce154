"""Bad input from Python: a one-line diffscope.Error (engine problems) or TypeError (wrong Python types) naming the
argument, and the session goes on with what it had. A seeded fuzz of every method's arguments must never crash."""
import pickle
import random
import shutil

import numpy as np
import pytest

import diffscope
from conftest import DEMO

PROMPT = "records: 7274 -> ocean; 1505 -> nectar. question: 1505 ->"


def one_line(e):
    msg = str(e.value)
    assert msg and "\n" not in msg, msg
    return msg


def test_open_errors(tmp_path):
    with pytest.raises(diffscope.Error) as e:
        diffscope.open(tmp_path / "missing")
    assert "missing" in one_line(e)
    pk = tmp_path / "pickled"
    pk.mkdir()
    shutil.copy(DEMO / "config.json", pk / "config.json")
    (pk / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": [1, 2, 3]}))
    with pytest.raises(diffscope.Error) as e:
        diffscope.open(pk)
    assert "pickle" in one_line(e).lower() or "safetensors" in one_line(e)
    arch = tmp_path / "arch"
    arch.mkdir()
    (arch / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}')
    with pytest.raises(diffscope.Error) as e:
        diffscope.open(arch)
    assert "GPT2" in one_line(e) or "gpt2" in one_line(e)
    with pytest.raises(diffscope.Error, match="unknown backend"):
        diffscope.open(DEMO, backend="tpu")
    with pytest.raises(TypeError, match="backend"):
        diffscope.open(DEMO, backend=3)
    with pytest.raises(TypeError):
        diffscope.open(DEMO, threads="two")
    with pytest.raises(diffscope.Error, match="threads"):
        diffscope.open(DEMO, threads=-2)


def test_query_errors_keep_the_session(demo):
    demo.run(PROMPT)
    before = demo.logprobs().copy()
    L, H, n = demo.layers, demo.heads, demo.n
    cases = [
        (lambda: demo.view(L, 0), f"layer {L}"),
        (lambda: demo.view(0, H), f"head {H}"),
        (lambda: demo.view(-1, 0), "layer -1"),
        (lambda: demo.view(0, 0, rect=(5, 5, 0, 3)), "empty view rectangle"),
        (lambda: demo.view(0, 0, rect=(0, 4)), "rect"),
        (lambda: demo.view(0, 0, grid=(0, 4)), "grid"),
        (lambda: demo.view(0, 0, grid=(1, 2, 3)), "grid"),
        (lambda: demo.view(0, 0, pool="median"), "pool"),
        (lambda: demo.view(0, 0, lambda_=float("nan")), "lambda_"),
        (lambda: demo.rows([n]), "outside"),
        (lambda: demo.rows([]), "no positions"),
        (lambda: demo.rows([0], layers=[L + 3]), "does not exist"),
        (lambda: demo.maps(L), "does not exist"),
        (lambda: demo.maps(0, max_bytes=10), "max_bytes"),
        (lambda: demo.set_lambda(L, 0.1), "does not exist"),
        (lambda: demo.set_lambda(0, float("inf")), "finite"),
        (lambda: demo.top_k(0), "at least 1"),
        (lambda: demo.row_mass(0, -1, (3, 2)), "span"),
        (lambda: demo.mamba_view(0, 0), "scan"),
        (lambda: demo.mamba_row(0, 0, 0), "scan"),
        (lambda: demo.run(np.array([0, 10 ** 6], dtype=np.int64)), "vocab"),
        (lambda: demo.run(np.arange(9000, dtype=np.int32) % 100), "9000"),
        (lambda: demo.view(0, 0, device=True), "CUDA"),
        (lambda: demo.generate(0), "max_new"),
        (lambda: demo.generate(5, temperature=-1.0), "temperature"),
        (lambda: demo.decode([-5]), "vocabulary"),
        (lambda: demo.stats(layers=[99]), "does not exist"),
    ]
    for f, needle in cases:
        with pytest.raises(diffscope.Error) as e:
            f()
        assert needle.lower() in one_line(e).lower(), (needle, str(e.value))
    # a prompt refused before it ran leaves the previous one in place
    demo.run(PROMPT)
    np.testing.assert_array_equal(demo.logprobs(), before)


def test_wrong_python_types(demo):
    for f in [lambda: demo.view("0", 0), lambda: demo.view(0, 0, grid="ab"), lambda: demo.rows("1"),
              lambda: demo.run(3.5), lambda: demo.run([1, "a"]), lambda: demo.run(np.zeros((2, 2), np.int32)),
              lambda: demo.run(np.zeros(3, np.float32)), lambda: demo.set_lambda(0, "x"), lambda: demo.top_k(None),
              lambda: demo.generate(True), lambda: diffscope.scan(DEMO, [3.0], backend="cpu")]:
        with pytest.raises(TypeError):
            f()


def test_closed_session():
    s = diffscope.open(DEMO, backend="cpu", threads=2)
    s.run(PROMPT)
    v = s.view(1, 0, grid=(4, 4))
    s.close()
    assert s.closed and "closed" in repr(s)
    for f in [lambda: s.run(PROMPT), s.top_k, lambda: s.view(1, 0), s.stats, s.profile, lambda: s.config]:
        with pytest.raises(diffscope.Error, match="closed"):
            f()
    assert np.isfinite(v.a1).all()  # results outlive their session
    s.close()  # twice is fine


def test_no_result_yet():
    with diffscope.open(DEMO, backend="cpu", threads=2) as s:
        for f in [s.top_k, lambda: s.view(0, 0), lambda: s.rows(-1), s.stats, lambda: s.maps(0)]:
            with pytest.raises(diffscope.Error, match="run"):
                f()


_VALUES = [None, True, -1, 0, 1, 2, 7, 2 ** 31, -(2 ** 63), 2 ** 70, 0.5, -0.0, float("nan"), float("inf"), "", "max",
           "x" * 1000, b"\x00", [], [0], [-1, 0, 5], [2 ** 40], (1, 2), (0, 3, 0, 3), (None, None, None, None),
           {"a": 1}, np.int64(3), np.float32(1.5), np.array([1, 2]), np.array([[1]]), np.array([], dtype=np.int32),
           object()]


def test_fuzz_arguments(demo):
    """Random arguments to every public method: only diffscope.Error, TypeError, ValueError, KeyError or
    OverflowError may come out, and the session still answers afterwards."""
    rng = random.Random(45)
    demo.run(PROMPT)
    methods = {
        "view": 6, "mamba_view": 5, "rows": 2, "maps": 1, "stats": 2, "set_lambda": 2, "top_k": 1, "logits": 1,
        "logprobs": 1, "row_mass": 3, "mamba_row": 3, "encode": 2, "decode": 1, "token_text": 1, "run": 1,
    }
    allowed = (diffscope.Error, TypeError, ValueError, KeyError, OverflowError)
    for i in range(1500):
        name = rng.choice(sorted(methods))
        args = [rng.choice(_VALUES) for _ in range(rng.randint(0, methods[name]))]
        try:
            r = getattr(demo, name)(*args)
            if name == "generate":
                list(r)
        except allowed:
            pass
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"{name}{tuple(args)!r} raised {type(e).__name__}: {e}")
        if name == "run":
            demo.run(PROMPT)
    for name in ("lambda_scale",):
        for v in _VALUES:
            try:
                setattr(demo, name, v)
            except allowed:
                pass
    demo.reset_lambda()
    demo.run(PROMPT)
    assert len(demo.top_k(3)) == 3
