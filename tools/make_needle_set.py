#!/usr/bin/env python3
"""Multi-needle retrieval sets of exact token lengths, for diffscope-scan and the demo models' evaluation.

    tools/make_needle_set.py --out set.jsonl [--lengths 1K,4K,16K] [--depths 0,0.25,0.5,0.75,1] [--needles 4]
                             [--distractors 2] [--per-cell 4] [--seed 0] [--tokenizer DIR_OR_FILE] [--filler FILE]
                             [--values any|word|code] [--format jsonl|text]

(--format text writes one prompt's text alone, e.g. assets/models/default_prompt.txt:
 --lengths 3072 --depths 0.5 --needles 3 --distractors 2 --values word --seed 5.)

One JSON object a line, one prompt each:

    {"text": "... The secret word of the blue door is otter. ... Question: what is the secret word of the blue
     door? Answer:", "answer": [begin, end], "target": " otter", "length": 4096, "depth": 0.5, "needles": 4,
     "distractors": 2, "sample": 0, "question_start": ..., "answer_token": ..., "depth_tokens": ..., "seed": 0}

* "answer": the character offsets [begin, end) (Python str indices, i.e. code points) in "text" of the queried
  needle's value as it stands in the haystack, its leading space included (" otter"); "target": what the model
  should produce greedily right after the prompt (the same text). "question_start": the offset of the question
  (the space before "Question:"); "answer_token": the index of the first token of the answer span (BOS counted);
  "depth_tokens": the tokens of the haystack before the queried needle over the haystack's tokens.
* "length": the prompt's exact token count as the engine runs it, special tokens (BOS) included, with the given
  tokenizer (default: the demo model's). Counting uses the `tokenizers` package when it is there and the tokenizer
  is a tokenizer.json, else `diffscope-run --tokenize-jsonl` (--diffscope-run PATH, default build/diffscope-run), as
  tools/make_needle_prompt.py does.
* "needles": facts in the haystack with distinct subjects, one of them queried; "distractors": near misses of the
  queried fact (the same template, one of colour, object or attribute changed, another value). The format is the
  demo models' training format (tools/demo_data.py): "The secret word of the blue door is otter." / " Question:
  what is the secret word of the blue door? Answer:".
* "depth": where the queried needle sits in the haystack, 0 (first) .. 1 (last, right before the question), as a
  fraction of the haystack's filler tokens; the other facts sit at random depths. For one length and sample the
  facts, their depths and the haystack are the same at every depth of the queried needle (up to the few sentences
  swapped to keep the length exact): only the queried needle moves.
* Haystack: the built-in filler sentences (tools/make_needle_prompt.py's and more, tools/demo_data.py), in seeded
  shuffled order, whole sentences, the length made exact by swapping sentences for shorter or longer ones; or, with
  --filler FILE, an excerpt of FILE's text (sentences in order, ending at a seeded place) trimmed on its left at a
  word (or inside one, when no whole number of words gives the exact length).

Deterministic for a seed. Counting is incremental: sentence costs are counted once, a prompt is counted whole once
or twice (an excerpt a few times more), so 64K-token prompts take well under a second each.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import demo_data as dd  # noqa: E402  (templates, values, built-in filler; standard library only)
import make_needle_prompt as mnp  # noqa: E402  (the token counter)

PROG = "make_needle_set"


class SetError(Exception):
    """A bad request (flag value, tokenizer, filler): reported as one line."""


# ------------------------------------------------------------------------------------------------
# Token counting
# ------------------------------------------------------------------------------------------------
def resolve_tokenizer(path: str) -> str:
    if os.path.isdir(path):
        for name in ("tokenizer.json", "tokenizer.model"):
            p = os.path.join(path, name)
            if os.path.isfile(p):
                return p
        raise SetError(f"--tokenizer {path}: the folder has no tokenizer.json or tokenizer.model")
    if not os.path.isfile(path):
        raise SetError(f"--tokenizer {path}: no such file or folder")
    return path


def default_diffscope_run() -> str:
    for p in (os.path.join(ROOT, "build", "diffscope-run"), shutil.which("diffscope-run") or ""):
        if p and os.access(p, os.X_OK):
            return p
    return ""


class Counter(mnp.Counter):
    """make_needle_prompt's counter (tokenizers, else diffscope-run --tokenize-jsonl), plus batches and offsets.
    Counts are of the text as the engine runs it: special tokens (BOS) included."""

    def __init__(self, tok_path: str = "", diffscope_run: str = "", tokenizer=None):
        if tokenizer is not None:  # a tokenizers.Tokenizer already loaded (tools/eval_demo.py)
            self.tok, self.tok_json, self.run, self.how = tokenizer, tok_path, diffscope_run, "tokenizers"
            return
        have_tokenizers = True
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            have_tokenizers = False
        if tok_path.endswith(".model") or not have_tokenizers:
            if not diffscope_run:
                why = "a sentencepiece tokenizer.model" if have_tokenizers else "the tokenizers package is missing"
                raise SetError(f"cannot count tokens ({why}): give --diffscope-run PATH")
            if not os.access(diffscope_run, os.X_OK):
                raise SetError(f"--diffscope-run {diffscope_run}: not an executable")
            self.tok, self.tok_json, self.run = None, tok_path, diffscope_run
            self.how = diffscope_run + " --tokenize-jsonl"
            return
        try:
            super().__init__(tok_path, diffscope_run)
        except SystemExit:
            raise SetError(f"--tokenizer {tok_path}: the tokenizers package cannot read it; give --diffscope-run PATH") \
                from None

    def _run_many(self, texts: list[str], special: bool) -> list[list[int]]:
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"text": t}) + "\n")
        cmd = [self.run, "--tokenizer", self.tok_json, "--tokenize-jsonl", f.name] + (["--add-special"] if special else [])
        try:
            p = subprocess.run(cmd, capture_output=True, text=True)
        finally:
            os.unlink(f.name)
        if p.returncode != 0:
            raise SetError(f"{self.run} --tokenize-jsonl failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
        lines = [l for l in p.stdout.splitlines() if l.strip()]
        if len(lines) != len(texts):
            raise SetError(f"{self.run} --tokenize-jsonl gave {len(lines)} lines for {len(texts)} texts")
        return [json.loads(l)["ids"] for l in lines]

    def many(self, texts: list[str], special: bool = True) -> list[int]:
        if not texts:
            return []
        if self.tok is not None:
            return [len(e.ids) for e in self.tok.encode_batch(list(texts), add_special_tokens=special)]
        return [len(ids) for ids in self._run_many(list(texts), special)]

    def __call__(self, text: str) -> int:
        return self.many([text])[0]

    def offsets(self, text: str):
        """(count, [(begin, end) per token]) with tokenizers (special tokens get (0, 0)); (count, None) otherwise."""
        if self.tok is None:
            return self(text), None
        e = self.tok.encode(text, add_special_tokens=True)
        return len(e.ids), [(0, 0) if s else o for o, s in zip(e.offsets, e.special_tokens_mask)]


# ------------------------------------------------------------------------------------------------
# Flags
# ------------------------------------------------------------------------------------------------
def parse_lengths(s: str) -> list[int]:
    out = []
    for part in s.split(","):
        p = part.strip()
        m = re.fullmatch(r"(\d+)\s*([kKmM]?)", p)
        if not m:
            raise SetError(f"--lengths: {part!r} is not a token count (e.g. 4096, 4K, 64K)")
        n = int(m.group(1)) * {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
        if n < 8:
            raise SetError(f"--lengths: {part!r} is too short")
        out.append(n)
    if not out:
        raise SetError("--lengths: empty")
    return out


def parse_depths(s: str) -> list[float]:
    out = []
    for part in s.split(","):
        p = part.strip()
        try:
            d = float(p[:-1]) / 100 if p.endswith("%") else float(p)
        except ValueError:
            raise SetError(f"--depths: {part!r} is not a number (fractions 0..1, or 0%..100%)") from None
        if not 0.0 <= d <= 1.0:
            raise SetError(f"--depths: {part!r} is outside 0..1")
        out.append(d)
    if not out:
        raise SetError("--depths: empty")
    return out


def split_sentences(text: str) -> list[str]:
    """Filler text -> sentences (whitespace collapsed); pieces longer than 400 characters cut at spaces."""
    text = re.sub(r"\s+", " ", text).strip()
    out = []
    for s in re.split(r"(?<=[.!?])\s+", text):
        while len(s) > 400:
            cut = s.rfind(" ", 0, 300)
            cut = cut if cut > 0 else 300
            out.append(s[:cut].strip())
            s = s[cut:].strip()
        if s:
            out.append(s)
    return out


# ------------------------------------------------------------------------------------------------
# Prompts
# ------------------------------------------------------------------------------------------------
def _boundary(cum: list[int], frac: float) -> int:
    """The unit boundary g (0..m, before unit g) whose token offset is closest to frac of the haystack."""
    want = frac * cum[-1]
    lo, hi = 0, len(cum) - 1
    while lo < hi:  # first g with cum[g] >= want
        mid = (lo + hi) // 2
        if cum[mid] < want:
            lo = mid + 1
        else:
            hi = mid
    if lo > 0 and want - cum[lo - 1] <= cum[lo] - want:
        lo -= 1
    return lo


class Maker:
    """Builds prompts for one tokenizer and filler."""

    def __init__(self, counter: Counter, filler: list[str] | None = None, excerpt: bool = False,
                 words: list[str] | None = None, values: str = "any"):
        self.count = counter
        self.pool = list(filler) if filler else dd.haystack_filler()
        if not self.pool:
            raise SetError("the filler has no sentences")
        self.excerpt = excerpt
        self.words = words or dd.WORDS
        self.values = values
        self._specials = counter.many([""])[0]
        self._cost: dict[int, int] = {}

    # cost of pool sentence i with a leading space, special tokens not counted
    def costs(self, idx: list[int]) -> list[int]:
        need = sorted({i for i in idx if i not in self._cost})
        for i0 in range(0, len(need), 4096):
            part = need[i0:i0 + 4096]
            for i, c in zip(part, self.count.many([" " + self.pool[i] for i in part])):
                self._cost[i] = max(0, c - self._specials)
        return [self._cost[i] for i in idx]

    def facts(self, rng: random.Random, needles: int, distractors: int):
        attr = None
        if self.values != "any":
            attr = rng.choice([a for a, k in dd.ATTRS if k == self.values])
        try:
            fs = dd.fact_set(rng, self.words, needles, distractors, attr)
        except ValueError as e:
            raise SetError(f"--needles {needles} --distractors {distractors}: {e}") from None
        fracs = [None] + [rng.random() for _ in fs[1:]]
        return fs, fracs

    @staticmethod
    def render(units: list[str], facts, fracs, depth: float, cum: list[int]):
        """Text of the prompt and its metadata: facts at the unit boundaries nearest to their depths."""
        place = []
        for k, (f, fr) in enumerate(zip(facts, fracs)):
            fr = depth if fr is None else fr
            tie = (0 if depth <= 0.5 else 2) if k == 0 else 1
            place.append((_boundary(cum, fr), fr, tie, k))
        place.sort()
        parts: list[str] = []
        span = fact_start = None
        pi = 0
        pos = 0

        def add(s):
            nonlocal pos
            if parts:
                parts.append(" ")
                pos += 1
            parts.append(s)
            pos += len(s)

        for g in range(len(units) + 1):
            while pi < len(place) and place[pi][0] == g:
                k = place[pi][3]
                role, (a, c, o), v = facts[k]
                if k == 0:  # fact_start: where the fact's first token begins (the joining space, if any)
                    fact_start = pos
                    b = pos + (1 if parts else 0) + len(dd.fact_prefix(a, c, o))
                    span = (b, b + 1 + len(v))
                add(dd.fact_text(a, c, o, v))
                pi += 1
            if g < len(units):
                add(units[g])
        question_start = pos
        role, (a, c, o), v = facts[0]
        parts.append(dd.question_text(a, c, o))
        return "".join(parts), span, question_start, fact_start, f" {v}"

    # --- shuffled built-in filler: whole sentences, swapped to make the length exact -------------------
    def _stream(self, rng: random.Random, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            perm = list(range(len(self.pool)))
            rng.shuffle(perm)
            if out and len(perm) > 1 and perm[0] == out[-1]:
                perm[0], perm[-1] = perm[-1], perm[0]
            out.extend(perm)
        return out[:n]

    def _adjust(self, sel: list[int], delta: int, rng: random.Random) -> int:
        """Swap / add / drop sentences of sel so that their summed cost changes by delta (as near as it can)."""
        allc = self.costs(list(range(len(self.pool))))
        by_cost: dict[int, list[int]] = {}
        for i, c in enumerate(allc):
            by_cost.setdefault(c, []).append(i)
        levels = sorted(by_cost)
        fails = 0
        for _ in range(100_000):
            if delta == 0:
                break
            if sel and fails < 4 * len(sel) + 8:
                i = rng.randrange(len(sel))
                c = allc[sel[i]]
                if delta > 0:
                    opts = [l for l in levels if c < l <= c + delta]
                    new = max(opts) if opts else None
                else:
                    opts = [l for l in levels if c + delta <= l < c]
                    new = min(opts) if opts else None
                if new is None:
                    fails += 1
                    continue
                cands = [j for j in by_cost[new]
                         if (i == 0 or sel[i - 1] != j) and (i + 1 >= len(sel) or sel[i + 1] != j)] or by_cost[new]
                sel[i] = rng.choice(cands)
                delta -= new - c
                fails = 0
                continue
            fails = 0
            if delta > 0:  # add a sentence: the longest that fits, else the shortest (then trim again)
                fit = [l for l in levels if l <= delta and l > 0]
                lvl = max(fit) if fit else levels[0] if levels[0] > 0 else levels[-1]
                sel.insert(rng.randrange(len(sel) + 1), rng.choice(by_cost[lvl]))
                delta -= lvl
            elif sel:  # drop a sentence: the longest that does not overshoot, else the shortest
                fit = [k for k, j in enumerate(sel) if allc[j] <= -delta]
                k = max(fit, key=lambda k: allc[sel[k]]) if fit else min(range(len(sel)), key=lambda k: allc[sel[k]])
                delta += allc[sel.pop(k)]
            else:
                break
        return delta

    def _haystack_shuffled(self, rng: random.Random, budget: int) -> list[int]:
        sel: list[int] = []
        total = 0
        avg = max(1, sum(self.costs(list(range(len(self.pool))))) // len(self.pool))
        while total < budget:
            more = self._stream(rng, (budget - total) // avg + 8)
            if sel and more and more[0] == sel[-1]:
                more = more[1:] + more[:1]
            for j, c in zip(more, self.costs(more)):
                if total >= budget:
                    break
                sel.append(j)
                total += c
        self._adjust(sel, budget - total, rng)
        return sel

    # --- an excerpt of the filler file, trimmed at a word on its left -------------------------------------
    def prompt(self, length: int, depth: float, needles: int, distractors: int, seed, sample: int) -> dict:
        frng = random.Random(f"{seed}:{length}:{sample}:facts")
        facts, fracs = self.facts(frng, needles, distractors)
        hrng = random.Random(f"{seed}:{length}:{sample}:haystack")
        bare = self.render([], facts, fracs, depth, [0])[0]
        fixed = self.count(bare)
        if fixed > length:
            raise SetError(f"--lengths {length}: too short for {needles} needle(s), {distractors} distractor(s) and the "
                           f"question (they take {fixed} tokens)")
        if not self.excerpt:
            sel = self._haystack_shuffled(hrng, length - fixed)
            for _ in range(12):
                units = [self.pool[j] for j in sel]
                cum = [0]
                for c in self.costs(sel):
                    cum.append(cum[-1] + c)
                text, span, qs, fs, target = self.render(units, facts, fracs, depth, cum)
                n, offs = self.count.offsets(text)
                if n == length:
                    break
                if self._adjust(sel, length - n, hrng) != 0:
                    break
            else:
                n = -1
        else:
            text, n, offs, span, qs, fs, target = self._prompt_excerpt(hrng, length, fixed, facts, fracs, depth)
        if n != length:
            raise SetError(f"cannot make a prompt of exactly {length} tokens with this tokenizer and filler "
                           f"(got {n}); try another --seed or --filler")
        if offs is not None:
            answer_token = next(i for i, (a, b) in enumerate(offs) if b > span[0] and a < span[1])
            tok_fact = next(i for i, (a, b) in enumerate(offs) if b > fs)
            tok_q = next(i for i, (a, b) in enumerate(offs) if b > qs)
        else:
            answer_token, tok_fact, tok_q = self.count.many([text[:span[0]], text[:fs], text[:qs]])
        hay = max(1, tok_q - self._specials)
        return {"text": text, "answer": list(span), "target": target, "length": length, "depth": depth,
                "needles": needles, "distractors": distractors, "sample": sample, "question_start": qs,
                "answer_token": answer_token, "depth_tokens": round((tok_fact - self._specials) / hay, 4),
                "seed": seed}

    def _prompt_excerpt(self, rng, length, fixed, facts, fracs, depth):
        """An excerpt of the filler ending at a seeded sentence end, as many words as make the length exact (the
        leftmost word cut from its left when no whole number of words does); another place when neither does."""
        budget = length - fixed
        r = None
        for _ in range(40):
            end = rng.randrange(len(self.pool)) + 1
            idx: list[int] = []
            total, j = 0, end
            while total < budget * 1.1 + 64 and len(idx) < 10 * len(self.pool) + budget:
                j = (j - 1) % len(self.pool)
                idx.append(j)
                total += self.costs([j])[0]
            idx.reverse()
            words: list[str] = []
            starts: list[bool] = []
            for i in idx:
                ws = self.pool[i].split(" ")
                words += ws
                starts += [True] + [False] * (len(ws) - 1)
            tpw = total / max(1, len(words))  # tokens per word
            seen: dict = {}

            def build(k, cut=0):
                if (k, cut) not in seen:
                    units: list[str] = []
                    for n, (w, st) in enumerate(zip(words[len(words) - k:], starts[len(words) - k:])):
                        w = w[cut:] if n == 0 else w
                        if st or not units:
                            units.append(w)
                        else:
                            units[-1] += " " + w
                    cum = [0]
                    for u in units:  # placement only: estimated costs
                        cum.append(cum[-1] + max(1, round(tpw * (u.count(" ") + 1))))
                    text, span, qs, fs, target = self.render(units, facts, fracs, depth, cum)
                    n, offs = self.count.offsets(text)
                    seen[(k, cut)] = (text, n, offs, span, qs, fs, target)
                return seen[(k, cut)]

            k = min(len(words), max(1, int(budget / max(tpw, 1e-6))))
            lo, hi = 0, len(words) + 1  # f(lo) < length < f(hi), as far as counted
            for _ in range(64):
                r = build(k)
                if r[1] == length:
                    return r
                if r[1] < length:
                    lo = k
                else:
                    hi = k
                if hi - lo <= 1:
                    break
                step = round((length - r[1]) / max(tpw, 0.2)) or (1 if r[1] < length else -1)
                k = min(hi - 1, max(lo + 1, k + step))
            if 1 <= lo and hi == lo + 1 and hi <= len(words):
                w = words[len(words) - hi]  # the word that takes the excerpt past the length: cut from its left
                a, b = 1, len(w) - 1
                while a <= b:
                    cut = (a + b) // 2
                    r = build(hi, cut)
                    if r[1] == length:
                        return r
                    if r[1] > length:
                        a = cut + 1
                    else:
                        b = cut - 1
        return r


def build_set(maker: Maker, lengths, depths, needles, distractors, per_cell, seed, progress=None) -> list[dict]:
    out = []
    for L in lengths:
        for d in depths:
            for i in range(per_cell):
                out.append(maker.prompt(L, d, needles, distractors, seed, i))
            if progress:
                progress(L, d)
    return out


# ------------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.exit(2)


def main(argv=None):
    ap = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output JSONL file ('-' for stdout)")
    ap.add_argument("--format", default="jsonl", choices=("jsonl", "text"),
                    help="jsonl (default), or text: the prompt's text alone and a newline (one prompt only; e.g. "
                         "for diffscope --prompt-file or assets/models/default_prompt.txt)")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "assets", "models", "diffllama-demo"),
                    help="a model folder, tokenizer.json or tokenizer.model (default: the demo model's)")
    ap.add_argument("--lengths", default="1K,2K,4K", help="token counts, BOS included: 4096, 4K, 64K (default 1K,2K,4K)")
    ap.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="queried needle depths, 0..1 (default 0,0.25,0.5,0.75,1)")
    ap.add_argument("--needles", type=int, default=1, help="facts with distinct subjects, one queried (default 1)")
    ap.add_argument("--distractors", type=int, default=0, help="near misses of the queried fact (default 0)")
    ap.add_argument("--per-cell", type=int, default=1, help="prompts per length x depth (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--filler", default="", help="haystack text file (default: the built-in filler sentences)")
    ap.add_argument("--values", default="any", choices=("any", "word", "code"),
                    help="value kind of the queried fact: words (' otter'), 4-digit codes, or either (default)")
    ap.add_argument("--diffscope-run", default=None,
                    help="count tokens with this diffscope-run when the tokenizers package cannot (default build/diffscope-run)")
    a = ap.parse_args(argv)
    try:
        lengths, depths = parse_lengths(a.lengths), parse_depths(a.depths)
        if a.needles < 1:
            raise SetError(f"--needles {a.needles}: at least 1 (the queried fact)")
        if a.distractors < 0:
            raise SetError(f"--distractors {a.distractors}: must not be negative")
        if a.per_cell < 1:
            raise SetError(f"--per-cell {a.per_cell}: at least 1")
        tok = resolve_tokenizer(a.tokenizer)
        run = a.diffscope_run if a.diffscope_run is not None else default_diffscope_run()
        counter = Counter(tok, run)
        filler, excerpt = None, False
        if a.filler:
            try:
                with open(a.filler, encoding="utf-8") as f:
                    filler = split_sentences(f.read())
            except (OSError, UnicodeDecodeError) as e:
                raise SetError(f"--filler {a.filler}: {e.strerror if isinstance(e, OSError) else e}") from None
            if not filler:
                raise SetError(f"--filler {a.filler}: no text")
            excerpt = True
        if a.format == "text" and len(lengths) * len(depths) * a.per_cell != 1:
            raise SetError("--format text writes one prompt: give one length, one depth and --per-cell 1")
        maker = Maker(counter, filler, excerpt, values=a.values)
        rows = build_set(maker, lengths, depths, a.needles, a.distractors, a.per_cell, a.seed)
    except SetError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 2
    if a.format == "text":
        data = rows[0]["text"] + "\n"
    else:
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if a.out == "-":
        sys.stdout.write(data)
    else:
        try:
            with open(a.out, "w", encoding="utf-8") as f:
                f.write(data)
        except OSError as e:
            sys.stderr.write(f"{PROG}: --out {a.out}: {e.strerror}\n")
            return 2
        what = (f"the text of 1 prompt (answer {rows[0]['target']!r} at token {rows[0]['answer_token']})"
                if a.format == "text" else f"{len(rows)} prompts ({len(lengths)} length(s) x {len(depths)} depth(s) x "
                                           f"{a.per_cell})")
        sys.stderr.write(f"{a.out}: {what}, {a.needles} needle(s), {a.distractors} distractor(s), counted with "
                         f"{counter.how}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
