#!/usr/bin/env python3
"""Checks tools/make_needle_set.py (registered by tests/needle_set.cmake).

    check_needle_set.py --runner build/diffscope-run --work DIR [--python PY]

Runs the generator on the demo model's tokenizer for a few short lengths, with the built-in filler and with a filler
file, and checks: every prompt has exactly its length in tokens as the engine counts them (diffscope-run
--tokenize-jsonl --add-special, independent of the Python tokenizers package the generator counts with), the answer
span is the queried needle's value in its fact and equals the target, the question asks about that fact, the fact
counts are right, the queried needle moves forward with the depth while the other facts stay, the output is
deterministic for a seed, --format text writes the same text, and bad flags exit 2 with one line.
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(ROOT, "tools", "make_needle_set.py")
TOKENIZER = os.path.join(ROOT, "assets", "models", "diffllama-demo", "tokenizer.json")
FACT = re.compile(r"The ([a-z ]+?) of the ([a-z]+) ([a-z]+) is ([a-z0-9]+)\.")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def gen(py, out, *args):
    p = subprocess.run([py, TOOL, "--out", out, "--tokenizer", TOKENIZER, *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"make_needle_set {' '.join(args)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    with open(out, encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


def engine_lengths(runner, work, rows):
    path = os.path.join(work, "texts.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"text": r["text"]}) + "\n")
    p = subprocess.run([runner, "--tokenizer", TOKENIZER, "--tokenize-jsonl", path, "--add-special"],
                       capture_output=True, text=True, check=True)
    return [len(json.loads(l)["ids"]) for l in p.stdout.splitlines() if l.strip()]


def check_rows(rows, runner, work, needles, distractors, name):
    for r, n in zip(rows, engine_lengths(runner, work, rows)):
        tag = f"{name} length {r['length']} depth {r['depth']} sample {r['sample']}"
        check(n == r["length"], f"{tag}: the engine counts {n} tokens")
        b, e = r["answer"]
        t = r["text"]
        check(t[b:e] == r["target"] and r["target"].startswith(" ") and len(r["target"]) > 1,
              f"{tag}: answer span {t[b:e]!r} vs target {r['target']!r}")
        # the span is the value of a fact "The A of the C O is V." and the question asks about that fact
        m = [f for f in FACT.finditer(t[:r["question_start"]]) if f.start(4) - 1 == b]
        check(len(m) == 1 and m[0].end(4) == e, f"{tag}: the answer span is not a fact's value")
        if m:
            q = f" Question: what is the {m[0].group(1)} of the {m[0].group(2)} {m[0].group(3)}? Answer:"
            check(t[r["question_start"]:] == q, f"{tag}: question {t[r['question_start']:]!r}")
        facts = FACT.findall(t[:r["question_start"]])
        check(len(facts) == needles + distractors, f"{tag}: {len(facts)} facts")
        check(len({(a, c, o) for a, c, o, v in facts}) == len(facts) and len({v for *_, v in facts}) == len(facts),
              f"{tag}: subjects or values repeat")
        if m:
            near = [f for f in facts if sum(x != y for x, y in zip(f[:3], m[0].groups()[:3])) == 1]
            check(len(near) >= distractors, f"{tag}: {len(near)} near misses, expected {distractors}")
        check(0 <= r["depth_tokens"] <= 1 and abs(r["depth_tokens"] - r["depth"]) < 0.25,
              f"{tag}: depth_tokens {r['depth_tokens']}")
    # depth ordering: for one length and sample the queried needle moves forward, the other facts stay
    groups = {}
    for r in rows:
        groups.setdefault((r["length"], r["sample"]), []).append(r)
    for key, g in groups.items():
        g.sort(key=lambda r: r["depth"])
        pos = [r["answer_token"] for r in g]
        check(all(a < b for a, b in zip(pos, pos[1:])), f"{name} {key}: answer tokens {pos} not increasing with depth")
        check(g[0]["answer_token"] <= 12, f"{name} {key}: depth 0 answer at token {g[0]['answer_token']}")
        check(g[-1]["question_start"] - g[-1]["answer"][1] <= 1, f"{name} {key}: depth 1 is not the last fact")
        others = [sorted(v for *_, v in FACT.findall(r["text"][:r["question_start"]])) for r in g]
        check(all(o == others[0] for o in others), f"{name} {key}: the facts differ between depths")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    py = a.python

    args = ["--lengths", "200,1K", "--depths", "0,0.25,0.5,0.75,1", "--needles", "3", "--distractors", "2",
            "--per-cell", "2", "--seed", "5"]
    rows = gen(py, os.path.join(a.work, "a.jsonl"), *args)
    check(len(rows) == 2 * 5 * 2, f"{len(rows)} prompts")
    check_rows(rows, a.runner, a.work, 3, 2, "built-in")
    again = gen(py, os.path.join(a.work, "b.jsonl"), *args)
    check(again == rows, "not deterministic for a seed")
    other = gen(py, os.path.join(a.work, "c.jsonl"), *args[:-1], "6")
    check(other != rows, "another seed gives the same prompts")

    filler = os.path.join(ROOT, "README.md")
    rows = gen(py, os.path.join(a.work, "d.jsonl"), "--lengths", "300,700", "--depths", "0,0.5,1", "--needles", "2",
               "--distractors", "1", "--filler", filler, "--values", "word")
    check_rows(rows, a.runner, a.work, 2, 1, "filler file")
    check(all(r["target"].strip().isalpha() for r in rows), "--values word gave codes")

    # --format text: one prompt's text and a newline, the same text as the JSONL line
    one = ["--lengths", "300", "--depths", "0.5", "--needles", "2", "--distractors", "1", "--seed", "3"]
    row = gen(py, os.path.join(a.work, "e.jsonl"), *one)[0]
    txt = os.path.join(a.work, "e.txt")
    p = subprocess.run([py, TOOL, "--out", txt, "--tokenizer", TOKENIZER, "--format", "text", *one],
                       capture_output=True, text=True)
    with open(txt, encoding="utf-8") as f:
        check(p.returncode == 0 and f.read() == row["text"] + "\n", "--format text differs from the JSONL text")

    for bad, needle in ((["--lengths", "4Q"], "--lengths"), (["--depths", "1.5"], "outside 0..1"),
                        (["--lengths", "16", "--needles", "4"], "too short"), (["--needles", "0"], "--needles"),
                        (["--filler", os.path.join(a.work, "missing.txt")], "--filler"),
                        (["--format", "text", "--lengths", "300,400"], "one prompt")):
        p = subprocess.run([py, TOOL, "--out", os.path.join(a.work, "bad.jsonl"), "--tokenizer", TOKENIZER, *bad],
                           capture_output=True, text=True)
        err = p.stderr.strip()
        check(p.returncode == 2 and needle in err and "\n" not in err and "Traceback" not in err,
              f"{bad}: exit {p.returncode}, {err!r}")
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("make_needle_set: all checks passed")


if __name__ == "__main__":
    main()
