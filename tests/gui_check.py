#!/usr/bin/env python3
"""GUI tests for diffscope: start the real program under Xvfb in --screenshot mode, then assert on its
--state-json sidecar and on the pixels of the PNG it wrote. Standard library only (PNG decoded with zlib).

usage: gui_check.py --exe build/diffscope --xvfb /usr/bin/xvfb-run --source DIR --work DIR CASE
CASE: fixture | lambda | corrupt | text | light | export | demo | bad_args | view | row | prompt_file | replay |
      hybrid | generate | corpus
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

SCREEN = "-screen 0 1600x1000x24"
FIXTURE = "tests/fixtures/diff_mha_d32_f32"
DEMO = "assets/models/diffllama-demo"
# Guards against hangs only, never speed goals: a run waits for its work to complete however long a busy 2-core
# machine takes; ctest's TIMEOUT (tests/gui_tests.cmake) is longer than a case's runs together.
HANG_GUARD_S = 1500
QUICK_GUARD_S = 600  # runs that should stop at once (usage errors)
IDS = "1,260,254,163,91,93,12,298,113,187,31,94,211,260,254,163,91,93,12,298,113,187,31,94,211"


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


# --- PNG ------------------------------------------------------------------------------------------------------
def read_png(path):
    """Returns (width, height, channels, rows) with rows a list of bytes objects (8-bit RGB or RGBA only)."""
    with open(path, "rb") as f:
        data = f.read()
    check(data[:8] == b"\x89PNG\r\n\x1a\n", "%s is not a PNG" % path)
    pos, idat, w = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            check(depth == 8 and ctype in (2, 6), "unsupported PNG format (depth %d, colour type %d)" % (depth, ctype))
            ch = 4 if ctype == 6 else 3
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = w * ch
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(h):
        ftype, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - ch] if x >= ch else 0
            b = prev[x]
            c = prev[x - ch] if x >= ch else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 255
            elif ftype == 2:
                line[x] = (line[x] + b) & 255
            elif ftype == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, ch, rows


def region(img, rect):
    """Pixels (r, g, b) of rect [x, y, w, h]."""
    w, h, ch, rows = img
    x0, y0, rw, rh = rect
    out = []
    for y in range(max(0, y0), min(h, y0 + rh)):
        row = rows[y]
        for x in range(max(0, x0), min(w, x0 + rw)):
            out.append(tuple(row[x * ch:x * ch + 3]))
    return out


def differing_fraction(a, b):
    check(len(a) == len(b) and a, "regions differ in size")
    return sum(1 for p, q in zip(a, b) if p != q) / len(a)


# --- running the program --------------------------------------------------------------------------------------
class Runner:
    def __init__(self, args):
        self.exe, self.xvfb, self.source = args.exe, args.xvfb, args.source
        self.run_exe = args.run_exe or os.path.join(os.path.dirname(args.exe), "diffscope-run")
        self.scan_exe = args.scan_exe or os.path.join(os.path.dirname(args.exe), "diffscope-scan")
        self.work = os.path.join(args.work, args.case)
        self.case, self.runs = args.case, 0
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        check(self.xvfb and os.path.exists(self.xvfb),
              "xvfb-run not found (%r): the GUI tests need it. HINT: apt-get install xvfb" % self.xvfb)

    def path(self, *p):
        return os.path.join(self.work, *p)

    def run(self, name, *extra, xvfb=True):
        png, js = self.path(name + ".png"), self.path(name + ".json")
        cmd = [self.exe, "--screenshot", png, "--state-json", js] + list(extra)
        if xvfb:
            # -a alone races when ctest -j starts several servers at once (both pick the first free number):
            # each case starts its search at its own display number.
            self.runs += 1
            start = 100 + 10 * sorted(CASES).index(self.case) + self.runs
            cmd = [self.xvfb, "-a", "-n", str(start), "-s", SCREEN] + cmd
        env = dict(os.environ, XDG_CONFIG_HOME=self.path("config"))
        print("$", " ".join(cmd), flush=True)
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=HANG_GUARD_S,
                           cwd=self.source)
        sys.stdout.write(p.stdout.decode(errors="replace"))
        if xvfb and p.returncode == 5 and b"problem while cleaning up temporary directory" in p.stdout:
            # xvfb-run's own cleanup failed after the program ran (its exit status replaces the program's; seen once
            # on a 2-core machine under ctest -j2): the wrapper's fault, not the GUI's, so the run is made again.
            print("(xvfb-run could not remove its temporary directory: running again)", flush=True)
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=HANG_GUARD_S,
                               cwd=self.source)
            sys.stdout.write(p.stdout.decode(errors="replace"))
        state = json.load(open(js)) if os.path.exists(js) else None
        img = read_png(png) if os.path.exists(png) else None
        return p.returncode, state, img

    def fixture(self):
        return os.path.join(self.source, FIXTURE)


def assert_sane_run(rc, state, img, n):
    check(rc == 0, "exit code %d, expected 0" % rc)
    check(state is not None and img is not None, "no sidecar or no screenshot written")
    check(img[0] == 1600 and img[1] == 1000, "screenshot is %dx%d, expected 1600x1000" % (img[0], img[1]))
    check(not state["error_shown"], "an error was shown: %s" % state["error"])
    check(state["n_tokens"] == n, "n_tokens %s, expected %d" % (state["n_tokens"], n))
    hm = state["head_maps"]
    check(hm["n"] == n, "head maps n %s" % hm["n"])
    if state["head_view"]["exact"]:
        # Every causal softmax row sums to 1, so each map sums to n.
        check(abs(hm["a1_sum"] - n) < 1e-2 and abs(hm["a2_sum"] - n) < 1e-2, "maps are not row-stochastic: %s" % hm)
    else:
        # A long prompt: the head view is a pooled grid, the row view the exact last row (sums to 1).
        rv = state["row_view"]
        check(rv["q"] == n - 1 and abs(rv["a1_sum"] - 1) < 1e-4 and abs(rv["a2_sum"] - 1) < 1e-4,
              "row view is not a softmax row: %s" % rv)
    L, H = state["model"]["layers"], state["model"]["view_heads"]
    check(len(state["statistics"]) == L * H, "statistics for %d heads, expected %d" % (len(state["statistics"]), L * H))
    check(len(state["next_token"]) > 0, "no next-token table")
    for key in ("a1", "a2", "diff"):
        px = region(img, state["map_rects"][key])
        check(len(px) > 100 * 100, "%s map is drawn too small: %s" % (key, state["map_rects"][key]))
        check(len(set(px)) >= 20, "%s map region is nearly uniform (%d colours)" % (key, len(set(px))))


# --- cases ----------------------------------------------------------------------------------------------------
def case_fixture(r):
    rc, st, img = r.run("fixture", "--model", r.fixture(), "--ids", IDS, "--head", "1.2")
    assert_sane_run(rc, st, img, 25)
    check(st["selected"] == {"layer": 1, "head": 2}, "selected head %s" % st["selected"])
    check(st["lambda"]["effective"] == st["lambda"]["model"], "lambda changed without being asked to")
    check(st["timings"]["forward_ms"] > 0 and st["timings"]["kernels"], "no profile")
    check(st["sweep"]["complete"] and len(st["sweep"]["points"]) >= 5, "lambda sweep missing")
    for name in ("Model", "Prompt", "Head", "Row", "Overview", "Lambda", "Profiler"):
        check(name in st["panels"], "panel %s not drawn" % name)
    # The row view starts on the last token; its exact softmax rows sum to 1.
    rv = st["row_view"]
    check(rv["q"] == 24 and rv["layer"] == 1 and rv["n"] == 25, "row view %s" % rv)
    check(abs(rv["a1_sum"] - 1) < 1e-4 and abs(rv["a2_sum"] - 1) < 1e-4, "row view rows do not sum to 1: %s" % rv)


def case_lambda(r):
    # Layer 0's maps depend on no lambda, so A1 must be pixel-identical while the difference map changes.
    rc0, s0, i0 = r.run("scale0", "--model", r.fixture(), "--ids", IDS, "--head", "0.1", "--lambda-scale", "0")
    rc1, s1, i1 = r.run("scale15", "--model", r.fixture(), "--ids", IDS, "--head", "0.1", "--lambda-scale", "1.5")
    assert_sane_run(rc0, s0, i0, 25)
    assert_sane_run(rc1, s1, i1, 25)
    check(all(v == 0 for v in s0["lambda"]["effective"]), "scale 0 must give lambda 0: %s" % s0["lambda"])
    for a, m in zip(s1["lambda"]["effective"], s1["lambda"]["model"]):
        check(abs(a - 1.5 * m) < 1e-9, "scale 1.5: %s" % s1["lambda"])
    check(abs(s0["head_maps"]["diff_sum"] - s0["head_maps"]["a1_sum"]) < 1e-3, "lambda 0: difference != A1")
    check(s0["head_maps"]["a1_checksum"] == s1["head_maps"]["a1_checksum"], "A1 of layer 0 changed with lambda")
    check(s0["head_maps"]["diff_checksum"] != s1["head_maps"]["diff_checksum"], "difference did not change")
    check(s0["map_rects"] == s1["map_rects"], "layout moved between runs")
    fa = differing_fraction(region(i0, s0["map_rects"]["a1"]), region(i1, s1["map_rects"]["a1"]))
    fd = differing_fraction(region(i0, s0["map_rects"]["diff"]), region(i1, s1["map_rects"]["diff"]))
    print("A1 pixels changed: %.4f, difference pixels changed: %.4f" % (fa, fd))
    check(fa == 0.0, "A1 panel pixels changed with lambda (%.4f)" % fa)
    check(fd > 0.05, "difference panel barely changed with lambda (%.4f)" % fd)
    # A head ablated from the start (--ablate; the head panel's box): the GUI's next-token table is diffscope-run's
    # with the same --ablate, and differs from the plain run's.
    rc3, s3, i3 = r.run("ablate", "--model", r.fixture(), "--ids", IDS, "--head", "1.1", "--ablate", "1.1",
                        "--ablate", "2.0")
    assert_sane_run(rc3, s3, i3, 25)
    check(s3["interventions"] == [{"kind": "ablate", "mode": "head", "layer": 1, "head": 1},
                                  {"kind": "ablate", "mode": "head", "layer": 2, "head": 0}],
          "interventions: %s" % s3.get("interventions"))
    cmd = [r.run_exe, "--backend", "cpu", "--model", r.fixture(), "--token-ids", IDS, "--ablate", "1.1", "--ablate",
           "2.0", "--top-k", str(len(s3["next_token"])), "--json"]
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=r.source)
    check(out.returncode == 0, "diffscope-run --ablate failed: %s" % out.stderr)
    want = json.loads(out.stdout)["top_k"]
    got = s3["next_token"]
    check([t["id"] for t in got] == [t["id"] for t in want] and
          all(abs(a["prob"] - b["prob"]) <= 1e-6 for a, b in zip(got, want)),
          "GUI next tokens with --ablate %s differ from diffscope-run's %s" % (got, want))
    plain = subprocess.run(cmd[:7] + cmd[11:], capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=r.source)
    check(json.loads(plain.stdout)["top_k"] != want, "the ablation changed nothing")
    # Head importance (--importance; the Overview's importance mode) under that ablation: diffscope-run's numbers.
    rc4, s4, i4 = r.run("importance", "--model", r.fixture(), "--ids", IDS, "--head", "1.1", "--ablate", "2.0",
                        "--importance")
    assert_sane_run(rc4, s4, i4, 25)
    imp = r.path("importance.json")
    cmd = [r.run_exe, "--backend", "cpu", "--model", r.fixture(), "--token-ids", IDS, "--ablate", "2.0",
           "--importance", imp]
    print("$", " ".join(cmd), flush=True)
    check(subprocess.run(cmd, stdout=subprocess.DEVNULL, timeout=HANG_GUARD_S, cwd=r.source).returncode == 0,
          "diffscope-run --importance failed")
    want = json.load(open(imp))
    got = s4.get("importance")
    check(got is not None and got["complete"] and got["target"] == want["target"] and got["layers"] == want["layers"],
          "GUI importance %s, expected %s" % (got and {k: got[k] for k in ("target", "complete")}, want["target"]))
    for gr, wr in zip(got["modes"]["head"], want["modes"]["head"]):
        check(all((a is None and b is None) or abs(a - b) <= 1e-5 for a, b in zip(gr, wr)),
              "GUI importance row %s differs from diffscope-run's %s" % (gr, wr))
    check(got["modes"]["head"][2][0] == 0.0, "an ablated head's importance is 0: %s" % got["modes"]["head"][2])
    # Dropped maps and a knockout (--ablate L.H:a1|a2, --knockout; the head panel's -A1 / -A2 boxes, the Lambda
    # panel's knockout field) and the Row panel's logit lens (--lens): diffscope-run's with the same flags.
    edits = ["--ablate", "1.1:a1", "--ablate", "2.0:a2", "--knockout", "all:-1:,3:9"]
    rc5, s5, i5 = r.run("edits", "--model", r.fixture(), "--ids", IDS, "--head", "1.1", "--lens", *edits)
    assert_sane_run(rc5, s5, i5, 25)
    lens_file = r.path("lens.json")
    cmd = [r.run_exe, "--backend", "cpu", "--model", r.fixture(), "--token-ids", IDS, *edits, "--lens", lens_file,
           "--top-k", str(len(s5["next_token"])), "--json"]
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=r.source)
    check(out.returncode == 0, "diffscope-run with the edits failed: %s" % out.stderr)
    cli_json = json.loads(out.stdout)
    check(s5["interventions"] == cli_json["interventions"] and len(s5["interventions"]) == 3,
          "GUI interventions %s, diffscope-run's %s" % (s5["interventions"], cli_json["interventions"]))
    got, want = s5["next_token"], cli_json["top_k"]
    check([t["id"] for t in got] == [t["id"] for t in want] and
          all(abs(a["prob"] - b["prob"]) <= 1e-6 for a, b in zip(got, want)),
          "GUI next tokens with the edits %s differ from diffscope-run's %s" % (got, want))
    gl, wl = s5.get("lens"), json.load(open(lens_file))
    check(gl is not None and gl["target"] == wl["target"] and len(gl["layers"]) == len(wl["layers"]),
          "GUI lens %s, diffscope-run's target %s" % (gl and gl["target"], wl["target"]))
    for a, b in zip(gl["layers"], wl["layers"]):
        pa, pb = a["positions"][0], b["positions"][0]
        check(pa["position"] == pb["position"] == 24 and [t["id"] for t in pa["top"]][:1] == [t["id"] for t in pb["top"]][:1]
              and abs(pa["target_prob"] - pb["target_prob"]) <= 1e-6 and pa["target_rank"] == pb["target_rank"],
              "GUI lens layer %d %s differs from diffscope-run's %s" % (a["layer"], pa, pb))
    # The Profiler's activation outliers (--outliers): diffscope-run --outliers's numbers.
    rc6, s6, i6 = r.run("outliers", "--model", r.fixture(), "--ids", IDS, "--head", "1.1", "--outliers")
    assert_sane_run(rc6, s6, i6, 25)
    out_file = r.path("outliers.json")
    cmd = [r.run_exe, "--backend", "cpu", "--model", r.fixture(), "--token-ids", IDS, "--outliers", out_file]
    print("$", " ".join(cmd), flush=True)
    check(subprocess.run(cmd, stdout=subprocess.DEVNULL, timeout=HANG_GUARD_S, cwd=r.source).returncode == 0,
          "diffscope-run --outliers failed")
    check(s6.get("outliers") == json.load(open(out_file)),
          "GUI outliers %s differ from diffscope-run's" % (s6.get("outliers") or {}).get("model"))
    # The quantisation what-if (--quantize-logits; the lambda panel's menu): diffscope-run's next tokens.
    rc7, s7, i7 = r.run("quantize", "--model", r.fixture(), "--ids", IDS, "--head", "1.1", "--quantize-logits", "4")
    assert_sane_run(rc7, s7, i7, 25)
    cmd = [r.run_exe, "--backend", "cpu", "--model", r.fixture(), "--token-ids", IDS, "--quantize-logits", "4",
           "--top-k", str(len(s7["next_token"])), "--json"]
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=r.source)
    check(out.returncode == 0, "diffscope-run --quantize-logits failed: %s" % out.stderr)
    want = json.loads(out.stdout)["top_k"]
    check(s7["logit_bits"] == 4 and [t["id"] for t in s7["next_token"]] == [t["id"] for t in want] and
          all(abs(a["prob"] - b["prob"]) <= 1e-6 for a, b in zip(s7["next_token"], want)),
          "GUI next tokens at 4 bits %s differ from diffscope-run's %s" % (s7["next_token"], want))
    # ... and its report against full precision (the lambda panel's "vs full precision" line) is diffscope-run's
    gq, cq = s7.get("quantization"), json.loads(out.stdout)["quantization"]
    check(gq is not None and gq["bits"] == 4 and gq["position"] == cq["position"] and
          abs(gq["kl"] - cq["kl"]) <= 1e-6 + 1e-4 * cq["kl"] and
          abs(gq["max_diff_change"] - cq["max_diff_change"]) <= 1e-5,
          "GUI quantisation report %s differs from diffscope-run's %s" % (gq, cq))
    # An intervention the model cannot take (--ablate of a layer it lacks): one line naming it, the valid one in force.
    rc8, s8, _ = r.run("refused", "--model", r.fixture(), "--ids", IDS, "--head", "1.1", "--ablate", "99.0",
                       "--ablate", "1.1")
    check(s8 is not None and s8["error_shown"] and "--ablate 99.0: layer 99" in s8["error"] and "\n" not in s8["error"] and
          s8["interventions"] == [{"kind": "ablate", "mode": "head", "layer": 1, "head": 1}],
          "refused intervention: rc %d, %s" % (rc8, s8 and (s8["error"], s8["interventions"])))
    # A lambda so large that the model overflows: the window says so instead of showing a NaN top-k.
    rc2, s2, _ = r.run("overflow", "--model", r.fixture(), "--ids", IDS, "--head", "0.1", "--lambda-scale", "1e300")
    check(s2 is not None and s2["error_shown"] and ("not finite" in s2["error"] or "finite number" in s2["error"]),
          "overflowing logits were not reported: rc %d, %s" % (rc2, s2 and s2["error"]))


def make_corrupt(r):
    bad = r.path("corrupt_model")
    shutil.copytree(r.fixture(), bad)
    st = os.path.join(bad, "model.safetensors")
    with open(st, "r+b") as f:
        f.truncate(os.path.getsize(st) // 2)
    return bad


def case_corrupt(r):
    bad = make_corrupt(r)
    rc, st, img = r.run("corrupt_only", "--model", bad)
    check(rc != 0, "a corrupt model must give a non-zero exit code")
    check(st and st["error_shown"] and "model.safetensors" in st["error"], "error not shown: %s" % (st and st["error"]))
    check(not st["has_model"], "a corrupt model must not be loaded")
    check(img is not None, "no screenshot of the error")
    # A good model first, then the corrupt one: the error is shown and the good model stays.
    rc, st, img = r.run("corrupt_after", "--model", r.fixture(), "--ids", IDS, "--open-after", bad)
    check(rc != 0, "a corrupt model must give a non-zero exit code")
    check(st["error_shown"] and "model.safetensors" in st["error"], "error not shown: %s" % st["error"])
    check(st["has_model"] and os.path.samefile(st["model"]["dir"], r.fixture()), "the previous model was not kept")
    check(st["n_tokens"] == 25, "the previous result was not kept")


def byte_level_tokenizer():
    """A GPT-2 style byte-level BPE over the 256 bytes and no merges: ids 0..255, valid for a 320-token model."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    return {"version": "1.0", "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": []}}


def case_text(r):
    model = r.path("text_model")
    shutil.copytree(r.fixture(), model)
    with open(os.path.join(model, "tokenizer.json"), "w") as f:
        json.dump(byte_level_tokenizer(), f)
    prompt = "The door code is 4729. The code is"
    rc, st, img = r.run("text", "--model", model, "--prompt", prompt, "--head", "2.3")
    assert_sane_run(rc, st, img, len(prompt.encode()))
    check(st["prompt"]["mode"] == "text" and st["prompt"]["text"] == prompt, "prompt %s" % st["prompt"])
    check("".join(st["prompt"]["tokens"]) == prompt, "token labels do not spell the prompt: %s" % st["prompt"]["tokens"])


def case_light(r):
    rc, st, img = r.run("light", "--model", r.fixture(), "--ids", IDS, "--theme", "light")
    assert_sane_run(rc, st, img, 25)
    check(st["theme"] == "light", "theme %s" % st["theme"])
    x, y, w, h = st["panels"]["Overview"]
    px = region(img, [x + 4, y + h - 12, w - 8, 6])  # the bottom strip of a panel is window background
    mean = sum(sum(p) for p in px) / (3 * len(px))
    check(mean > 180, "light theme background is dark (mean %.0f)" % mean)


def case_demo(r):
    rc, st, img = r.run("demo")  # no --model: the default model and prompt
    check(rc == 0, "exit code %d" % rc)
    check(st["model"]["dir"].rstrip("/").endswith("diffllama-demo"), "default model %s" % st["model"]["dir"])
    assert_sane_run(rc, st, img, st["n_tokens"])
    check(st["n_tokens"] > 10, "default prompt too short")


def read_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    check(data[:6] == b"\x93NUMPY" and data[6] == 1, "%s: not an NPY v1 file" % path)
    (hl,) = struct.unpack("<H", data[8:10])
    header = data[10:10 + hl].decode("latin1")
    check((10 + hl) % 64 == 0 and header.endswith("\n"), "%s: header not padded to 64 bytes" % path)
    check("'descr': '<f4'" in header and "'fortran_order': False" in header, "%s: header %r" % (path, header))
    shape = tuple(int(v) for v in header.split("'shape': (")[1].split(")")[0].split(",") if v.strip())
    count = shape[0] * shape[1]
    values = struct.unpack("<%df" % count, data[10 + hl:10 + hl + 4 * count])
    check(len(data) == 10 + hl + 4 * count, "%s: trailing bytes" % path)
    return shape, values


def case_export(r):
    out = r.path("export")
    os.makedirs(out)
    rc, st, img = r.run("export", "--model", r.fixture(), "--ids", IDS, "--head", "2.1", "--export-dir", out)
    assert_sane_run(rc, st, img, 25)
    hm = st["head_maps"]
    for name, key in (("a1", "a1_sum"), ("a2", "a2_sum"), ("diff", "diff_sum")):
        shape, values = read_npy(os.path.join(out, "head_%s.npy" % name))
        check(shape == (25, 25), "npy shape %s" % (shape,))
        check(abs(sum(values) - hm[key]) < 1e-3, "%s.npy sums to %f, state says %f" % (name, sum(values), hm[key]))
    with open(os.path.join(out, "head.csv")) as f:
        lines = [l for l in f.read().splitlines() if not l.startswith("#")]
    check(lines[0] == "query,key,query_token,key_token,a1,a2,diff", "csv header %r" % lines[0])
    check(len(lines) - 1 == 25 * 26 // 2, "csv has %d rows, expected the %d causal cells" % (len(lines) - 1, 25 * 26 // 2))
    sess = json.load(open(os.path.join(out, "session.json")))
    check(sess["lambda"] == st["lambda"] and sess["prompt"]["ids"] == st["prompt"]["ids"], "session.json differs")
    check(sess["device"]["backend"] and sess["timings"]["kernels"], "session.json lacks device or timings")
    w, h, _, _ = read_png(os.path.join(out, "panel_Head.png"))
    check([w, h] == st["panels"]["Head"][2:], "panel PNG is %dx%d, panel is %s" % (w, h, st["panels"]["Head"]))


def case_view(r):
    # A zoomed rectangle is asked of the engine at one cell per token; the pooled whole map in mean mode has
    # the same row sums (each causal row sums to 1, and mean pooling of a full map keeps block averages).
    rc, st, img = r.run("view", "--model", r.fixture(), "--ids", IDS, "--head", "1.2", "--view", "4:12,4:12",
                        "--mouse", "900,200")
    check(rc == 0 and not st["error_shown"], "rc %d, error %s" % (rc, st and st["error"]))
    v = st["head_view"]
    check([v["q0"], v["q1"], v["k0"], v["k1"]] == [4, 12, 4, 12], "view rectangle %s" % v)
    check(v["rows"] == 8 and v["cols"] == 8 and v["exact"], "a small rectangle must be exact: %s" % v)
    # Rows 4..11 restricted to keys 4..11 sum to at most 8; the map regions are still drawn.
    check(0 < st["head_maps"]["a1_sum"] <= 8 + 1e-3, "A1 sum over the rectangle %s" % st["head_maps"]["a1_sum"])
    for key in ("a1", "a2", "diff"):
        px = region(img, st["map_rects"][key])
        check(len(set(px)) >= 8, "%s map region is nearly uniform (%d colours)" % (key, len(set(px))))
    # Keys past the end are clamped into the map; --pool mean is reported back.
    rc, st, img = r.run("view_clamp", "--model", r.fixture(), "--ids", IDS, "--view", "20:40,20:40", "--pool", "mean")
    v = st["head_view"]
    check(rc == 0 and v["q1"] == 25 and v["k1"] == 25 and v["q1"] - v["q0"] == 20, "clamped view %s" % v)
    check(v["pool"] == "mean", "pool %s" % v["pool"])


def case_row(r):
    rc, st, img = r.run("row", "--model", r.fixture(), "--ids", IDS, "--head", "2.3", "--row", "5")
    assert_sane_run(rc, st, img, 25)
    rv = st["row_view"]
    check(rv["q"] == 5 and rv["layer"] == 2 and rv["head"] == 3, "row view %s" % rv)
    check(abs(rv["a1_sum"] - 1) < 1e-4 and abs(rv["a2_sum"] - 1) < 1e-4, "row view rows do not sum to 1: %s" % rv)
    x, y, w, h = st["panels"]["Row"]
    px = region(img, [x + 4, y + 30, w - 8, h - 34])
    check(len(set(px)) >= 30, "row panel is nearly empty (%d colours)" % len(set(px)))
    # Negative positions count from the end.
    rc, st, img = r.run("row_neg", "--model", r.fixture(), "--ids", IDS, "--row", "-3")
    check(rc == 0 and st["row_view"]["q"] == 22, "--row -3: %s" % st.get("row_view"))
    # Out of range is said in the banner, not silently clamped (the window still shows the nearest head and row).
    for i, (flag, value, needle) in enumerate([("--head", "9.0", "layer 9 does not exist"),
                                               ("--head", "1.7", "head 7 does not exist"),
                                               ("--row", "40", "the prompt has 25 tokens"),
                                               ("--view", "30:40,0:5", "starts past the prompt's 25 tokens")]):
        rc, st, img = r.run("out_of_range_%d" % i, "--model", r.fixture(), "--ids", IDS, flag, value)
        check(st is not None and st["error_shown"] and needle in st["error"],
              "%s %s: %s" % (flag, value, st and st["error"]))
        check(st["n_tokens"] == 25 and st["head_maps"]["n"] == 25, "%s %s: nothing shown" % (flag, value))


def case_replay(r):
    # A lambda drag replayed one value a frame: the log has a line per frame, every value was set once in order,
    # the last one set is the one shown at the end, and latencies are positive.
    log = r.path("replay.csv")
    rc, st, img = r.run("replay", "--model", r.fixture(), "--ids", IDS, "--head", "1.0",
                        "--replay-lambda", "1,-0.2,1.2,12", "--replay-log", log)
    assert_sane_run(rc, st, img, 25)
    import csv
    with open(log) as f:
        rows = list(csv.DictReader(f))
    sets = [float(x["lambda_set"]) for x in rows if x["lambda_set"]]
    check(len(sets) == 12 and abs(sets[0] + 0.2) < 1e-9 and abs(sets[-1] - 1.2) < 1e-9, "values set %s" % sets)
    check(all(b > a for a, b in zip(sets, sets[1:])), "values not set in order: %s" % sets)
    check(abs(float(rows[-1]["lambda_shown"]) - 1.2) < 1e-9, "last shown %s" % rows[-1])
    lat = [float(x["latency_ms"]) for x in rows if x["latency_ms"]]
    check(lat and all(x > 0 for x in lat), "latencies %s" % lat)
    # The dragged layer is the head view's: its difference map follows the values too (before each run ends).
    dl = [float(x["diff_latency_ms"]) for x in rows if x["diff_latency_ms"]]
    check(dl and all(x > 0 for x in dl), "difference map latencies %s" % dl)
    check(abs(float(rows[-1]["diff_lambda_shown"]) - 1.2) < 1e-6, "difference map's last lambda %s" % rows[-1])
    check(abs(st["lambda"]["override"][1] - 1.2) < 1e-9 if "lambda" in st and "override" in st["lambda"] else True,
          "state lambda %s" % st.get("lambda"))


def case_prompt_file(r):
    # A prompt longer than the head panel has pixels, from a file: the head view is the engine's pooled grid of the
    # whole map at about one cell per pixel (never more than 1024 per side), the row view the exact last row.
    # About 900 tokens: more than the panel has pixels (so the view is pooled), well short of the default prompt
    # (only gui_demo opens the default).
    with open(os.path.join(r.source, "assets", "models", "default_prompt.txt")) as f:
        text = f.read().strip()
    text = text[:len(text) * 3 // 10].rsplit(" ", 1)[0]
    path = r.path("long_prompt.txt")
    with open(path, "w") as f:
        f.write(text + "\n")
    rc, st, img = r.run("prompt_file", "--prompt-file", path, "--mouse", "560,300")
    check(rc == 0 and not st["error_shown"], "rc %d, error %s" % (rc, st and st["error"]))
    n = st["n_tokens"]
    check(n > 400, "the prompt file gave %d tokens" % n)
    check(st["prompt"]["text"] == text, "prompt text is not the file's (trailing newline dropped)")
    v = st["head_view"]
    check([v["q0"], v["q1"], v["k0"], v["k1"]] == [0, n, 0, n], "head view rectangle %s" % v)
    w = st["map_rects"]["a1"][2]
    check(not v["exact"] and v["rows"] == v["cols"] and v["rows"] <= min(n, 1024) and abs(v["rows"] - w) <= 2,
          "grid %s for a %d-pixel map of %d tokens" % (v, w, n))
    rv = st["row_view"]
    check(rv["q"] == n - 1 and abs(rv["a1_sum"] - 1) < 1e-4, "row view %s" % rv)
    L, H = st["model"]["layers"], st["model"]["view_heads"]
    check(len(st["statistics"]) == L * H, "statistics for %d heads" % len(st["statistics"]))
    px = region(img, st["map_rects"]["a1"])
    check(len(set(px)) >= 20, "A1 map region is nearly uniform")
    # An unreadable file is a usage error before any window opens.
    p = subprocess.run([r.exe, "--prompt-file", r.path("missing.txt")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=QUICK_GUARD_S)
    check(p.returncode == 2 and "missing.txt" in p.stdout.decode(), "missing prompt file: rc %d" % p.returncode)


def safetensors_tensor(path, name):
    """One F32 or I64 tensor of a safetensors file, flat, and its shape (the test machine need not have numpy)."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        t = header[name]
        fmt = {"F32": "f", "I64": "q"}[t["dtype"]]
        begin, end = t["data_offsets"]
        f.seek(8 + size + begin)
        data = f.read(end - begin)
    return list(struct.unpack("<%d%s" % (len(data) // struct.calcsize(fmt), fmt), data)), t["shape"]


def case_hybrid(r):
    # Phi-4-mini-flash (SambaY): asked for a memory (Mamba) layer, the head view shows the implicit attention of the
    # asked channel of its scan (the reference's map of that channel, whole); a GMU layer, which has no map of any
    # kind, opens the next layer with maps; the statistics cover only the attention layers; a sliding-window
    # layer's rows still sum to 1.
    fx = os.path.join(r.source, "tests/fixtures/phi4flash_L12_gqa_sharded_f32")
    ids = "20,27,53,72,52,72,31,59,6,65,41,21,4,7,59,21,60,56,11,62,0,29,50,12,69,24"
    rc, st, img = r.run("hybrid", "--model", fx, "--ids", ids, "--head", "6.1")
    check(rc == 0 and not st["error_shown"], "rc %d, error %s" % (rc, st and st["error"]))
    hm = st["head_maps"]
    check(hm["layer"] == 6 and hm["kind"] == "memory" and hm["implicit"] and not hm["differential"]
          and hm["head"] == 1, "memory layer 6, channel 1: %s" % hm)
    ref, shape = safetensors_tensor(os.path.join(fx, "expected.safetensors"), "layers.6.implicit")
    chans, _ = safetensors_tensor(os.path.join(fx, "expected.safetensors"), "layers.6.implicit_channels")
    nn = shape[1] * shape[2]
    m1 = ref[chans.index(1) * nn:(chans.index(1) + 1) * nn]
    scale = sum(abs(x) for x in m1)
    check(abs(hm["a1_sum"] - sum(m1)) < 1e-3 * scale and abs(hm["diff_abs_sum"] - scale) < 1e-3 * scale,
          "implicit attention of channel 1 differs from the reference: %s vs sum %g, |sum| %g" % (hm, sum(m1), scale))
    px = region(img, st["map_rects"]["a1"])
    check(len(set(px)) >= 20, "implicit attention map region is nearly uniform (%d colours)" % len(set(px)))
    # The row view follows: the last query's row of the same channel's map, exactly.
    rv, n = st["row_view"], shape[1]
    want = sum(m1[(n - 1) * n:n * n])
    check(rv["implicit"] and rv["layer"] == 6 and rv["channel"] == 1 and rv["q"] == n - 1
          and abs(rv["a1_sum"] - want) < 1e-3 * scale, "row view of the implicit map: %s, expected sum %g" % (rv, want))
    rc, st, img = r.run("hybrid_gmu", "--model", fx, "--ids", ids, "--head", "8.0")
    hm = st["head_maps"]
    check(rc == 0 and hm["layer"] == 9 and hm["kind"] == "cross", "GMU layer 8 -> 9: %s" % hm)
    check(abs(hm["a1_sum"] - 26) < 1e-2 and abs(hm["a2_sum"] - 26) < 1e-2, "maps are not row-stochastic: %s" % hm)
    layers = sorted({s["layer"] for s in st["statistics"]})
    check(layers == [1, 3, 5, 7, 9, 11], "statistics of layers %s, expected the attention layers" % layers)
    # The Table 5 reader (--max-abs-hidden; Profiler, "max |h|"): every layer's max |hidden| over the prompt, the
    # values diffscope-run --stats writes for the same model and ids.
    rc, st, img = r.run("hybrid_maxabs", "--model", fx, "--ids", ids, "--head", "3.0", "--max-abs-hidden")
    check(rc == 0 and not st["error_shown"], "rc %d, error %s" % (rc, st and st["error"]))
    stats = r.path("stats.json")
    cmd = [r.run_exe, "--backend", "cpu", "--model", fx, "--token-ids", ids, "--stats", stats]
    print("$", " ".join(cmd), flush=True)
    check(subprocess.run(cmd, stdout=subprocess.DEVNULL, timeout=HANG_GUARD_S, cwd=r.source).returncode == 0,
          "diffscope-run --stats failed")
    want = json.load(open(stats))["max_abs_hidden"]
    got = st.get("max_abs_hidden")
    check(got is not None and len(got) == len(want) == 12, "max_abs_hidden %s, expected %s" % (got, want))
    check(all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) and b > 0 for a, b in zip(got, want)),
          "GUI max_abs_hidden %s differs from diffscope-run's %s" % (got, want))
    rc, st, img = r.run("hybrid_swa", "--model", fx, "--ids", ids, "--head", "3.0")
    hm = st["head_maps"]
    check(rc == 0 and hm["kind"] == "sliding window" and hm["window"] == 6, "sliding window layer: %s" % hm)
    check(abs(hm["a1_sum"] - 26) < 1e-2, "banded maps are not row-stochastic: %s" % hm)
    for key in ("a1", "a2", "diff"):
        px = region(img, st["map_rects"][key])
        check(len(set(px)) >= 20, "%s map region is nearly uniform (%d colours)" % (key, len(set(px))))


def cli_generate(r, *args):
    """What diffscope-run --json prints for the same model, prompt and options (the engine's reference)."""
    cmd = [r.run_exe, "--backend", "cpu", "--json"] + list(args)
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=HANG_GUARD_S, cwd=r.source)
    check(p.returncode == 0, "diffscope-run failed (%d): %s" % (p.returncode, p.stderr.decode(errors="replace")))
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def count_colour(img, rect, rgb):
    return sum(1 for p in region(img, rect) if p == rgb)


def case_generate(r):
    # Greedy generation of 6 tokens after the first run: the GUI's continuation is the engine's (diffscope-run), the
    # sequence (maps, rows, statistics) covers prompt + generated, and a generated row can be selected.
    demo = os.path.exists(os.path.join(r.source, DEMO, "config.json"))
    if demo:
        model = os.path.join(r.source, DEMO)
        text = "The pass code of the blue door is 4729. Question: what is the pass code of the blue door? Answer:"
        prompt_gui, prompt_cli = ["--prompt", text], ["--prompt", text]
    else:
        model = r.fixture()
        prompt_gui, prompt_cli = ["--ids", IDS], ["--token-ids", IDS]
    ref = cli_generate(r, "--model", model, "--generate", "6", *prompt_cli)
    P = ref["prompt_tokens"]
    check(len(ref["generated"]) == 6, "diffscope-run generated %s" % ref["generated"])
    rc, st, img = r.run("generate", "--model", model, "--backend", "cpu", "--generate", "6", "--row", str(P + 2),
                        *prompt_gui)
    assert_sane_run(rc, st, img, P + 6)
    check(st["prompt_tokens"] == P, "prompt_tokens %s, diffscope-run says %d" % (st["prompt_tokens"], P))
    check(len(st["prompt"]["ids"]) == P, "prompt ids %d, expected %d" % (len(st["prompt"]["ids"]), P))
    check(len(st["generated"]) == 6, "%d ids generated, expected 6: %s" % (len(st["generated"]), st["generated"]))
    check(st["generated"] == ref["generated"], "GUI generated %s, diffscope-run %s" % (st["generated"], ref["generated"]))
    check(st["stop_reason"] == ref["stop_reason"] == "max_tokens", "stop reason %r / %r" % (st["stop_reason"], ref["stop_reason"]))
    if demo:
        check(st["generated_text"] == ref["text"], "generated text %r, diffscope-run %r" % (st["generated_text"], ref["text"]))
    else:
        check("generated_text" not in st, "generated_text without a tokenizer")
    check(st["generation"]["now"]["ids"] == ref["generated"] and not st["generation"]["streaming"], "generation %s" % st["generation"])
    rv = st["row_view"]
    check(rv["q"] == P + 2 and rv["generated"] and rv["n"] == P + 6, "row view %s" % rv)
    check(abs(rv["a1_sum"] - 1) < 1e-4, "the generated row does not sum to 1: %s" % rv)
    check(st["selected_generated_row"] == {"q": P + 2, "index": 2}, "selected row %s" % st["selected_generated_row"])
    # The Generate panel shows the continuation as tokens in the generated colour, the selected one outlined.
    check("Generate" in st["panels"], "Generate panel not drawn")
    gen_rect = st["panels"]["Generate"]
    px = region(img, gen_rect)
    check(len(set(px)) >= 20, "Generate panel nearly uniform (%d colours)" % len(set(px)))
    chips = count_colour(img, gen_rect, (24, 88, 74))
    check(chips > 300, "generated tokens not drawn in the Generate panel (%d pixels of their colour)" % chips)
    check(count_colour(img, gen_rect, (255, 196, 0)) > 20, "the selected generated token is not outlined")

    # Sampling: the same seed and options give the engine's continuation; then a regeneration under lambda x0 keeps
    # the first continuation as "before" and generates the one diffscope-run gives at that scale.
    fx = r.fixture()
    opts = ["--temperature", "0.9", "--sample-top-k", "40", "--top-p", "0.95", "--seed", "7"]
    ref1 = cli_generate(r, "--model", fx, "--token-ids", IDS, "--generate", "8", *opts)
    ref0 = cli_generate(r, "--model", fx, "--token-ids", IDS, "--generate", "8", "--lambda-scale", "0", *opts)
    rc, st, img = r.run("regenerate", "--model", fx, "--ids", IDS, "--generate", "8", *opts,
                        "--regenerate-lambda-scale", "0")
    assert_sane_run(rc, st, img, 25 + len(ref0["generated"]))
    g = st["generation"]
    check(g["before"] is not None and g["before"]["ids"] == ref1["generated"],
          "before %s, diffscope-run %s" % (g["before"] and g["before"]["ids"], ref1["generated"]))
    check(g["now"]["ids"] == ref0["generated"] == st["generated"], "now %s, diffscope-run at scale 0 %s" % (g["now"]["ids"], ref0["generated"]))
    check(g["before"]["lambda"]["scale"] == 1 and g["now"]["lambda"]["scale"] == 0, "lambda of the continuations %s" % g)
    check(g["now"]["options"]["seed"] == 7 and g["now"]["options"]["top_k"] == 40, "options %s" % g["now"]["options"])
    diff = next((i for i, (a, b) in enumerate(zip(ref1["generated"], ref0["generated"])) if a != b), -1)
    check(g["first_diff"] == diff, "first difference %s, expected %d" % (g["first_diff"], diff))
    check(all(v == 0 for v in st["lambda"]["effective"]), "lambda scale 0 not applied: %s" % st["lambda"])
    check(st["row_view"]["generated"] and st["row_view"]["q"] == st["n_tokens"] - 1, "row view %s" % st["row_view"])

    # Bad generation flags are one-line usage errors, not crashes.
    for bad in (["--temperature", "-1"], ["--top-p", "0"], ["--top-p", "1.5"], ["--generate", "0"],
                ["--generate", "x"], ["--sample-top-k", "-2"], ["--seed", "-1"], ["--regenerate-lambda-scale", "0"]):
        p = subprocess.run([r.exe] + bad, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=QUICK_GUARD_S)
        out = p.stdout.decode(errors="replace").strip()
        check(p.returncode == 2 and bad[0] in out and len(out.splitlines()) == 1,
              "%s: rc %d, %r" % (bad, p.returncode, out))


def demo_corpus_line(i, depth):
    """A retrieval prompt in the demo model's training format: four pass codes, one asked for; the answer span is
    the asked code's characters in the text, the target the code the model should answer."""
    facts = [("blue door", "4729"), ("red door", "1185"), ("blue gate", "6032"), ("green box", "3310")]
    key, code = facts[i]
    parts = ["The pass code of the %s is %s." % f for j, f in enumerate(facts) if j != i]
    parts.insert(depth, "The pass code of the %s is %s." % (key, code))
    filler = ["The function returns a list of the matching entries.", "This option is ignored when the file does not exist."]
    text = " ".join(parts[:2] + filler + parts[2:]) + " Question: what is the pass code of the %s? Answer:" % key
    b = text.index(code)
    return {"text": text, "answer": [b, b + len(code)], "target": " " + code, "depth": depth}


def close(a, b, tol=1e-5):
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= tol)


SHORT_PROMPT = "The secret word of the red door is walrus. Question: what is the secret word of the red door? Answer:"


def case_corpus(r):
    # The Corpus panel: a scan of a JSONL corpus on the demo model (CPU), a bad line listed and skipped, the report
    # (the same as diffscope-scan's), a prompt of it opened in the views with its answer span marked, Stop keeping
    # what was done, and a missing file as a one-line error.
    model = os.path.join(r.source, DEMO)
    # The window's own prompt stays short: the demo's default (3K tokens) would cost every run a long CPU forward and
    # lambda sweep before the scan starts.
    lines = [json.dumps(demo_corpus_line(0, 0)), json.dumps(demo_corpus_line(1, 3)), '{"text": "a broken line"',
             json.dumps(demo_corpus_line(2, 1)), "", json.dumps({"ids": [0, 17, 42, 99, 5, 17, 42, 99, 5], "answer": [2, 4]}),
             json.dumps(demo_corpus_line(3, 2))]
    corpus = r.path("corpus.jsonl")
    with open(corpus, "w") as f:
        f.write("\n".join(lines) + "\n")
    report_path, plot_path = r.path("report.json"), r.path("report.png")
    rc, st, img = r.run("corpus", "--model", model, "--backend", "cpu", "--prompt", SHORT_PROMPT, "--head", "3.1", "--scan", corpus,
                        "--scan-open", "1", "--scan-report", report_path, "--scan-plot", plot_path)
    check(rc == 0 and st and not st["error_shown"], "rc %d, error %s" % (rc, st and st["error"]))
    sc = st["scan"]
    check(sc and not sc["running"] and sc["complete"] and not sc["stopped"] and sc["error"] == "", "scan state %s" % sc)
    check(sc["total"] == 5 and sc["done"] == 5, "prompts: %d in the file, %d scanned, expected 5" % (sc["total"], sc["done"]))
    check([e["line"] for e in sc["skipped"]] == [3] and "JSON" in sc["skipped"][0]["error"], "skipped %s" % sc["skipped"])
    rep = sc["report"]
    check(rep["tool"] == "diffscope-scan" and rep["complete"] and rep["prompts"] == 5, "report %s" % {k: rep.get(k) for k in ("tool", "complete", "prompts")})
    check([p["line"] for p in rep["per_prompt"]] == [1, 2, 4, 6, 7], "report lines %s" % [p["line"] for p in rep["per_prompt"]])
    check(rep["with_target"] == 4 and rep["accuracy"] is not None, "accuracy %s of %s" % (rep["accuracy"], rep["with_target"]))
    L, H = st["model"]["layers"], st["model"]["view_heads"]
    check(len(rep["layers"]) == L and all(len(l["heads"]) == H for l in rep["layers"]), "report layers x heads")
    for part in ("answer", "sink", "context"):
        check(0 <= rep["mean"][part + "1"] <= 1, "mean %s" % rep["mean"])
    check(abs(rep["mean"]["answer1"] + rep["mean"]["sink1"] + rep["mean"]["context1"] - 1) < 1e-6, "A1 fractions do not sum to 1")
    # --scan-report / --scan-plot: the same report on disk, and its figure.
    with open(report_path) as f:
        saved = json.load(f)
    check(saved == rep, "the saved report differs from the one in the state")
    w, h, _, _ = read_png(plot_path)
    check(w >= 800 and h >= 400, "plot is %dx%d" % (w, h))
    # The opened prompt (row 1 = line 2): its text is the prompt, the row view is its last token, the span is marked.
    op, pp = sc["open"], rep["per_prompt"][1]
    check(op and op["index"] == 1 and op["line"] == 2 and op["on_screen"], "open %s" % op)
    check(st["prompt"]["mode"] == "text" and st["prompt"]["text"] == json.loads(lines[1])["text"], "prompt %s" % st["prompt"]["text"])
    check(st["n_tokens"] == pp["tokens"] == op["tokens"] and len(st["prompt"]["ids"]) == pp["tokens"],
          "opened prompt has %d tokens, the report says %d" % (st["n_tokens"], pp["tokens"]))
    rv = st["row_view"]
    check(rv["q"] == pp["tokens"] - 1 and rv["layer"] == 3 and rv["head"] == 1, "row view %s" % rv)
    check(rv["answer"]["begin"] == pp["answer"][0] and rv["answer"]["end"] == pp["answer"][1] and rv["answer"]["line"] == 2,
          "answer span %s, report %s" % (rv["answer"], pp["answer"]))
    check(st["lambda"]["scale"] == 1 and st["lambda"]["effective"] == st["lambda"]["model"], "lambda %s" % st["lambda"])
    # The panel: drawn with a heatmap of the layer x head grid and the answer span marked in the row view.
    check("Corpus" in st["panels"] and sc["heatmap_rect"], "Corpus panel or heatmap not drawn")
    cells = set(region(img, sc["heatmap_rect"]))
    check(len(cells) >= 12, "heatmap nearly uniform (%d colours)" % len(cells))
    marks = count_colour(img, st["panels"]["Row"], (190, 120, 255))
    check(marks > 40, "answer span not marked in the row view (%d pixels of its colour)" % marks)
    x, y, pw, ph = st["panels"]["Corpus"]
    check(len(set(region(img, [x + 4, y + 30, pw - 8, ph - 34]))) >= 40, "Corpus panel nearly empty")

    # diffscope-scan on the same corpus writes the same report (its numbers; times aside).
    if not os.path.exists(r.scan_exe):
        print("note: %s not built: the comparison with diffscope-scan is left out" % r.scan_exe)
    else:
        cli = r.path("cli_report.json")
        cmd = [r.scan_exe, "--model", model, "--backend", "cpu", "--input", corpus, "--out", cli, "--no-progress"]
        print("$", " ".join(cmd), flush=True)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=HANG_GUARD_S, cwd=r.source)
        check(p.returncode == 0, "diffscope-scan failed (%d): %s" % (p.returncode, p.stdout.decode(errors="replace")))
        with open(cli) as f:
            ref = json.load(f)
        check(ref["skipped"] == rep["skipped"] and ref["prompts"] == rep["prompts"] and ref["correct"] == rep["correct"],
              "GUI and diffscope-scan disagree on the prompts")
        for k, v in ref["mean"].items():
            check(close(v, rep["mean"][k]), "mean %s: GUI %s, diffscope-scan %s" % (k, rep["mean"][k], v))
        for la, lb in zip(ref["layers"], rep["layers"]):
            for ha, hb in zip(la["heads"], lb["heads"]):
                for k, v in ha.items():
                    check(close(v, hb[k]), "layer %d head %d %s: GUI %s, diffscope-scan %s" % (la["layer"], ha["head"], k, hb[k], v))
        for a, b in zip(ref["per_prompt"], rep["per_prompt"]):
            check(a["output"] == b["output"] if "output" in a else "output" not in b, "outputs differ at line %d" % a["line"])

    # Two replicas (--backend cpu,cpu: two CPU backends standing in for two GPUs, one thread each): the panel says so,
    # and its report is diffscope-scan's on one one-thread backend, number for number.
    if r.scan_exe and os.path.exists(r.scan_exe):
        rc, st2, img2 = r.run("corpus_replicas", "--model", model, "--backend", "cpu,cpu", "--threads", "1", "--prompt",
                              SHORT_PROMPT, "--scan", corpus)
        check(rc == 0 and st2 and not st2["error_shown"], "replicas: rc %d, error %s" % (rc, st2 and st2["error"]))
        sc2 = st2["scan"]
        check(sc2["replicas"] == 2 and sc2["complete"] and sc2["done"] == 5, "replica scan state %s" % {k: sc2[k] for k in sc2 if k != "report"})
        cli1 = r.path("cli_one_thread.json")
        subprocess.run([r.scan_exe, "--model", model, "--backend", "cpu", "--threads", "1", "--input", corpus, "--out", cli1,
                        "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=HANG_GUARD_S, cwd=r.source)
        ref1 = json.load(open(cli1))
        rep2 = sc2["report"]
        for key in ("mean", "layers", "groups", "skipped", "prompts", "accuracy"):
            check(ref1[key] == rep2[key], "two replicas' %s differs from diffscope-scan's on one backend" % key)
        check([p["line"] for p in ref1["per_prompt"]] == [p["line"] for p in rep2["per_prompt"]], "per-prompt order")

    # One prompt: the row view's answer fractions of the opened head (recomputed from the exact row) are the scan's.
    one = r.path("one.jsonl")
    with open(one, "w") as f:
        f.write(lines[3] + "\n")
    rc, st, img = r.run("corpus_one", "--model", model, "--backend", "cpu", "--prompt", SHORT_PROMPT, "--head", "4.2", "--scan", one,
                        "--scan-open", "0")
    check(rc == 0 and not st["error_shown"], "rc %d, error %s" % (rc, st and st["error"]))
    rep = st["scan"]["report"]
    cell = next(l for l in rep["layers"] if l["layer"] == 4)["heads"][2]
    fr = st["row_view"]["answer"]["fractions"]
    for k, v in cell.items():
        if k != "head":
            check(v is None or abs(v - fr[k]) < 1e-4, "%s: the scan says %s, the row view %s" % (k, v, fr.get(k)))

    # Stop after 2 prompts with a second run at lambda x0: both runs keep the same 2 prompts, the report is partial.
    rc, st, img = r.run("corpus_stop", "--model", model, "--backend", "cpu", "--prompt", SHORT_PROMPT, "--scan", corpus, "--scan-compare", "0",
                        "--scan-stop-after", "2", "--scan-view", "difference")
    sc = st["scan"]
    check(rc == 0 and sc["stopped"] and not sc["complete"] and sc["done"] == 2, "stopped scan %s" % {k: sc[k] for k in sc if k != "report"})
    rep = sc["report"]
    check(not rep["complete"] and rep["prompts"] == 2 and rep["compare"]["prompts"] == 2, "partial report")
    check(rep["compare"]["lambda_scale"] == 0 and sc["view"] == 2, "compare run %s" % rep["compare"]["lambda_scale"])
    for k in ("answer1", "sink1", "context1"):  # lambda does not change A1 of layer 0
        check(close(rep["layers"][0]["heads"][0][k], rep["compare"]["layers"][0]["heads"][0][k], 1e-6), "layer 0 A1 moved with lambda")
    check(len(set(region(img, sc["heatmap_rect"]))) >= 12, "difference heatmap nearly uniform")

    # A missing file: a one-line error naming it, the model and its prompt stay.
    rc, st, img = r.run("corpus_missing", "--model", model, "--backend", "cpu", "--prompt", SHORT_PROMPT, "--scan", r.path("missing.jsonl"))
    check(rc != 0 and st["error_shown"] and "missing.jsonl" in st["error"] and "\n" not in st["error"], "error %r" % st["error"])
    check(st["scan"]["error"] == st["error"] and st["has_model"] and st["n_tokens"] > 0, "after a missing corpus %s" % st["scan"])
    # Every line bad: listed, nothing scanned, and --scan-open says there is no such prompt (exit code 1).
    bad = r.path("all_bad.jsonl")
    with open(bad, "w") as f:
        f.write('garbage\n{"text": 5, "answer": [0, 1]}\n')
    rc, st, img = r.run("corpus_all_bad", "--model", model, "--backend", "cpu", "--prompt", SHORT_PROMPT, "--scan", bad, "--scan-open", "0")
    sc = st["scan"]
    check(rc == 1 and "--scan-open" in st["error"] and sc["done"] == 0 and sc["report"]["prompts"] == 0,
          "rc %d, error %r, scan %s" % (rc, st["error"], {k: sc[k] for k in sc if k != "report"}))
    check([e["line"] for e in sc["skipped"]] == [1, 2] and "not a string" in sc["skipped"][1]["error"], "skipped %s" % sc["skipped"])
    # Scan flags without --scan are usage errors.
    for bad in (["--scan-open", "1"], ["--scan-compare", "0"], ["--scan", "x.jsonl", "--scan-stop-after", "2"],
                ["--scan", "x.jsonl", "--scan-view", "difference"], ["--scan", "x.jsonl", "--scan-fraction", "answer3"]):
        p = subprocess.run([r.exe] + bad, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=QUICK_GUARD_S)
        out = p.stdout.decode(errors="replace").strip()
        check(p.returncode == 2 and len(out.splitlines()) == 1 and "--scan" in out, "%s: rc %d, %r" % (bad, p.returncode, out))


def case_bad_args(r):
    p = subprocess.run([r.exe, "--head", "x"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=QUICK_GUARD_S)
    out = p.stdout.decode()
    check(p.returncode == 2 and "--head" in out, "bad --head: rc %d, %r" % (p.returncode, out))
    p = subprocess.run([r.exe, "--state-json", "x.json"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=QUICK_GUARD_S)
    check(p.returncode == 2, "--state-json without --screenshot accepted")
    for bad in (["--view", "5:4,0:3"], ["--view", "x"], ["--pool", "median"], ["--mouse", "1,2"], ["--row", "x"],
                ["--prompt", "a", "--prompt-file", "b"]):
        p = subprocess.run([r.exe] + bad, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=QUICK_GUARD_S)
        check(p.returncode == 2 and bad[0] in p.stdout.decode(), "%s: rc %d, %r" % (bad, p.returncode, p.stdout))


def case_compare(r):
    # The Compare panel (--compare): the twin opened beside the demo model on the same token ids; both rows' masses on
    # the answer span are diffscope-scan's fractions of the same heads, both models' outliers are diffscope-run's, and
    # the panel is drawn. A folder that is not a model is a one-line error in the panel; the main model stays.
    model, twin = os.path.join(r.source, DEMO), os.path.join(r.source, "assets/models/llama-demo")
    line = demo_corpus_line(2, 1)
    src = r.path("text.jsonl")
    with open(src, "w") as f:
        f.write(json.dumps({"text": line["text"]}) + "\n" + json.dumps({"text": line["text"][:line["answer"][0]]}) + "\n")
    p = subprocess.run([r.run_exe, "--tokenizer", os.path.join(model, "tokenizer.json"), "--tokenize-jsonl", src],
                       stdout=subprocess.PIPE, check=True)
    full, before = [json.loads(l)["ids"] for l in p.stdout.decode().splitlines()]
    b = len(before)
    ids, span = ",".join(map(str, full)), [b, b + 2]
    corpus = r.path("one.jsonl")
    with open(corpus, "w") as f:
        f.write(json.dumps({"ids": full, "answer": span}) + "\n")
    cells, outl = {}, {}
    for name, m in (("main", model), ("second", twin)):
        rep_path, out_path = r.path(name + "_scan.json"), r.path(name + "_outliers.json")
        subprocess.run([r.scan_exe, "--backend", "cpu", "--model", m, "--input", corpus, "--out", rep_path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True)
        cells[name] = json.load(open(rep_path))["layers"][4]["heads"][2]
        subprocess.run([r.run_exe, "--backend", "cpu", "--model", m, "--token-ids", ids, "--outliers", out_path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True)
        outl[name] = json.load(open(out_path))
    rc, st, img = r.run("compare", "--model", model, "--backend", "cpu", "--ids", ids, "--head", "4.2", "--outliers",
                        "--compare", twin, "--compare-answer", "%d:%d" % tuple(span))
    check(rc == 0 and st and not st["error_shown"], "rc %d, error %s" % (rc, st and st["error"]))
    c = st["compare"]
    check(c and c["error"] == "" and c["same_ids"] and c["n_tokens"] == len(full) and c["family"] == "Llama",
          "compare state %s" % {k: v for k, v in (c or {}).items() if k not in ("main", "second")})
    check(c["answer"] == span, "answer span %s, asked %s" % (c["answer"], span))
    for name in ("main", "second"):
        side = c[name]
        check(side and side["layer"] == 4 and side["head"] == 2 and side["q"] == len(full) - 1, "%s row %s" % (name, side))
        for k, v in cells[name].items():
            if k != "head":
                check(v is None or abs(v - side["fractions"][k]) < 1e-4,
                      "%s %s: diffscope-scan %s, the Compare panel %s" % (name, k, v, side["fractions"].get(k)))
        check(side["outliers"] == outl[name], "%s outliers differ from diffscope-run's" % name)
        # the panel's table: sink, answer and rest of the shown map (A1 - lambda*A2, or A of a plain model)
        m = "_diff" if name == "main" else "1"
        tab = side["table"]
        check(all(abs(tab[c] - side["fractions"][k + m]) < 1e-9 for c, k in
                  (("sink", "sink"), ("answer", "answer"), ("rest", "context"))), "%s table %s" % (name, tab))
    check(set(cells["second"]) - {"head"} == set(c["second"]["fractions"]), "plain model keys %s" % sorted(c["second"]["fractions"]))
    px = region(img, st["panels"]["Compare"])
    check(len(set(px)) >= 40, "Compare panel nearly uniform (%d colours)" % len(set(px)))
    # Not a model: the panel says so in one line, the main model and its result stay.
    rc, st, img = r.run("compare_bad", "--model", model, "--backend", "cpu", "--ids", ids, "--compare", r.path("nowhere"))
    c = st["compare"]
    check(st["has_model"] and st["n_tokens"] == len(full), "main model after a bad --compare")
    check("nowhere" in c["error"] and "\n" not in c["error"], "compare error %r" % c["error"])
    for bad in (["--compare-answer", "3:1", "--compare", twin], ["--compare-answer", "1:2"]):
        p = subprocess.run([r.exe, "--model", model] + bad, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=QUICK_GUARD_S)
        out = p.stdout.decode(errors="replace").strip()
        check(p.returncode == 2 and "--compare" in out and len(out.splitlines()) == 1, "%s: rc %d, %r" % (bad, p.returncode, out))


def case_split(r):
    # A layer split (--backend cpu,cpu --gpu-mem-limit: two CPU backends stand in for two GPUs, forced to split the
    # demo model): the Model panel says where the layers are, and the maps, rows, statistics, next token and a
    # generation equal one CPU backend's (the same threads) bit for bit.
    model = os.path.join(r.source, DEMO)
    common = ["--model", model, "--threads", "1", "--prompt", SHORT_PROMPT, "--head", "4.1", "--generate", "3"]
    rc, one, _ = r.run("one", "--backend", "cpu", *common)
    check(rc == 0 and not one["error_shown"], "one backend: rc %d, %s" % (rc, one and one["error"]))
    rc, two, img = r.run("split", "--backend", "cpu,cpu", "--gpu-mem-limit", "80M", *common)
    check(rc == 0 and not two["error_shown"], "split: rc %d, %s" % (rc, two and two["error"]))
    check("layer split: layers 0-" in two["device"]["backend"], "backend %r" % two["device"]["backend"])
    for key in ("statistics", "next_token", "generated", "head_maps", "row_view"):
        check(one[key] == two[key], "%s differs between one backend and the split" % key)
    check(len(two["generated"]) == 3, "generated %s" % two["generated"])
    px = region(img, two["panels"]["Model"])
    check(len(set(px)) >= 20, "Model panel nearly uniform")
    # The Profiler's lanes: one per device in layer order, covering every layer once, the second block after the first
    lanes = two["timings"]["lanes"]
    check([l["device"] for l in lanes] == ["CPU 0", "CPU 1"], "lanes %r" % lanes)
    check(lanes[0]["first_layer"] == 0 and lanes[0]["end_layer"] == lanes[1]["first_layer"] and
          lanes[1]["end_layer"] == two["model"]["layers"], "lane layers %r" % lanes)
    check(all(l["end_ms"] > l["start_ms"] >= 0 and l["handoff_ms"] >= 0 for l in lanes), "lane times %r" % lanes)
    check(lanes[1]["start_ms"] >= lanes[0]["end_ms"] - 1e-6, "the blocks overlap: %r" % lanes)
    check(one["timings"]["lanes"] == [], "one backend has lanes: %r" % one["timings"]["lanes"])
    # A limit nothing fits: one line with the numbers; the window stays up with no model.
    rc, bad, _ = r.run("split_bad", "--backend", "cpu,cpu", "--gpu-mem-limit", "1M", *common)
    check(bad["error_shown"] and "does not fit the 2 devices" in bad["error"] and "\n" not in bad["error"], "error %r" % bad["error"])


CASES = {"compare": case_compare, "split": case_split, "fixture": case_fixture, "lambda": case_lambda, "corrupt": case_corrupt, "text": case_text,
         "light": case_light, "demo": case_demo, "bad_args": case_bad_args, "export": case_export,
         "view": case_view, "row": case_row, "prompt_file": case_prompt_file, "replay": case_replay,
         "hybrid": case_hybrid, "generate": case_generate, "corpus": case_corpus}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    ap.add_argument("--xvfb", default="")
    ap.add_argument("--source", required=True)
    ap.add_argument("--run-exe", default="", help="diffscope-run (default: beside --exe)")
    ap.add_argument("--scan-exe", default="", help="diffscope-scan (default: beside --exe)")
    ap.add_argument("--work", required=True)
    ap.add_argument("case", choices=sorted(CASES))
    args = ap.parse_args()
    try:
        CASES[args.case](Runner(args))
    except (Failure, subprocess.TimeoutExpired) as e:
        print("FAIL: %s" % e)
        return 1
    print("PASS: gui %s" % args.case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
