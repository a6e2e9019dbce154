#!/usr/bin/env python3
"""Token-exact parity of diffscope's tokenizers with the Python `tokenizers` and `sentencepiece` packages.

Generates a few thousand test strings (ASCII, accents, combining marks, CJK, emoji with skin tones and ZWJ,
zero-width and non-breaking spaces, CRLF, runs of spaces and newlines, digit runs, contractions in both cases,
added/special tokens inside text, the empty string, random code points), writes them as JSONL {"text": ...},
runs RUNNER --tokenizer FILE --tokenize-jsonl IN.jsonl (one {"ids": [...]} line out per line in, no special
tokens added) for every tokenizer in tests/tokenizers/, and compares with the Python ids exactly. With
--extended (the runner is diffscope-run, with --add-special and --decode) it also compares ids with the post-processor's special tokens
and decode(ids). Prints the first mismatches; exits 1 on any mismatch, 2 when a package is missing.

  python3 tools/tokenizer_parity.py --runner build/diffscope-run --extended
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

try:
    from tokenizers import Tokenizer
    import sentencepiece
except ImportError as e:  # CI installs both; a missing package is a failure, not a skip
    print(f"tokenizer_parity: FAILED: Python package missing ({e}); run: pip install tokenizers sentencepiece")
    sys.exit(2)

WORDS = ("the of and to in is was that for it with as his on be at by had are but from or have an they which one "
         "you were her all she there would their we him been has when who will more no if out so said what up its "
         "model layer head softmax lambda query key value differential attention tokenizer Hello world").split()
FRAGMENTS = [
    # accents, combining marks, other scripts
    "café", "naïve", "Ångström", "e\u0301", "n\u0303o", "straße", "ÆØÅ", "Łódź", "İstanbul", "ǅ",
    "注意力机制", "東京都", "日本語のテキスト", "한국어", "深度学习", "こんにちは", "Привет мир", "Γειά σου",
    "مرحبا بالعالم", "שלום", "नमस्ते", "สวัสดี", "ქართული", "Ελληνικά",
    # emoji with modifiers, ZWJ, flags, variation selectors, keycaps
    "😀", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "🧑🏿‍💻", "🏳️‍🌈", "🇫🇷🇩🇪", "❤️", "✨", "🚀", "1️⃣", "👩🏽‍🔬", "🫠",
    # spaces that are not ASCII spaces, zero-width characters
    "\u00a0", "\u202f", "\u3000", "\u2002", "\u2009", "\u200b", "\u200c", "\u200d", "\ufeff", "\u180e", "\u0085",
    "\u2028", "\u2029", "\u1680", "\u205f",
    # control whitespace, CRLF, runs
    "\r\n", "\r", "\n", "\t", "\x0b", "\x0c", "\r\n\r\n", "\n\n\n", "  ", "    ", " \n ", "\t\t", " \t\n",
    # digits of many kinds
    "0", "7", "42", "123", "1234", "12345678", "3.14159", "1,000,000", "٣٤٥", "１２３", "²", "½", "Ⅻ", "๓",
    # contractions, upper and lower case, odd apostrophes
    "'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'d", "'D", "it's", "IT'S",
    "don't", "DON'T", "we'll", "WE'LL", "’s", "'ſ", "'K", "''", "'",
    # punctuation and code
    "...", "!!!", "?!", "--", "—", "«»", "“quoted”", "(x)", "[1, 2]", "{'a': 1}", "a+b=c", "#include <vector>",
    "def f(x):\n    return x\n", "for (int i = 0; i < n; ++i) {", "</div>", "<br/>", "http://example.com/a?b=c",
    "user@example.com", "$100", "@@", "~~~", "\\n", "\\x41",
]
EDGE = ["", " ", "  ", "\n", "a", "A", "'", "\t", "\u200b", "😀", " 😀", "Hello", " Hello", "Hello ", "Hello  world",
        "   leading", "trailing   ", "\n\nnewlines\n\n", "\r\n\r\n", "a\r\nb", "x" * 300, " " * 50, "\n" * 40,
        "1" * 40, "ab" * 200, "👍🏽" * 30, "注" * 100,
        # case boundaries (o200k's pattern splits upper-case runs from words) and a titlecase letter (\p{Lt})
        "HTTPServer", "XMLHttpRequest", "iPhone", "McDonald's", "DON'T", "I'LL", "ǅungla Ǉudi", "ÀÉÎõü", "a/b/c\n"]


def special_fragments(path):
    """The added tokens of a tokenizer.json, plus near misses."""
    if not path.endswith(".json"):
        return ["<s>", "</s>", "<unk>"]
    data = json.load(open(path, encoding="utf-8"))
    out = []
    for t in data.get("added_tokens") or []:
        c = t["content"]
        out += [c, " " + c, c + " ", "  " + c + "  ", c[:-1], c + c, "x" + c + "y", "<" + c + ">"]
    return out


def make_strings(seed, n, specials):
    rnd = random.Random(seed)
    out = list(EDGE)
    out += [s for s in FRAGMENTS]
    out += specials
    pool = FRAGMENTS + WORDS
    while len(out) < n:
        kind = rnd.random()
        parts = []
        if kind < 0.35:  # prose with mixed fragments
            for _ in range(rnd.randint(1, 30)):
                r = rnd.random()
                if r < 0.6:
                    w = rnd.choice(WORDS)
                    parts.append(w.upper() if rnd.random() < 0.1 else w.capitalize() if rnd.random() < 0.2 else w)
                elif r < 0.9:
                    parts.append(rnd.choice(FRAGMENTS))
                elif specials:
                    parts.append(rnd.choice(specials))
                parts.append(rnd.choice([" ", " ", " ", "", "  ", "\n", ", ", ". "]))
        elif kind < 0.6:  # fragments glued without separators
            for _ in range(rnd.randint(1, 12)):
                parts.append(rnd.choice(pool + (specials if rnd.random() < 0.2 else [])))
        elif kind < 0.75:  # whitespace and digit runs
            for _ in range(rnd.randint(1, 8)):
                parts.append(rnd.choice([" ", "\n", "\t", "\r\n", "\u00a0", "\u3000"]) * rnd.randint(1, 12))
                parts.append(str(rnd.randint(0, 10 ** rnd.randint(1, 12))) if rnd.random() < 0.5 else rnd.choice(WORDS))
        elif kind < 0.9:  # random code points from a few blocks (no surrogates)
            blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0x97F),
                      (0x2000, 0x206F), (0x3000, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0xFF00, 0xFFEF),
                      (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x10000, 0x1007F)]
            for _ in range(rnd.randint(1, 40)):
                lo, hi = rnd.choice(blocks)
                parts.append(chr(rnd.randint(lo, hi)))
        else:  # contractions and apostrophes
            for _ in range(rnd.randint(1, 10)):
                parts.append(rnd.choice(WORDS) + rnd.choice(["'s", "'S", "'ll", "'LL", "'t", "'re", "'VE", "'d", "'M", "’s"]))
                parts.append(rnd.choice([" ", "", "  ", "\n"]))
        out.append("".join(parts))
    return out[:n] if len(out) > n else out


class Reference:
    def __init__(self, path):
        self.path = path
        if path.endswith(".model"):
            self.sp = sentencepiece.SentencePieceProcessor(model_file=path)
            self.hf = None
        else:
            self.hf = Tokenizer.from_file(path)
            self.sp = None

    def encode(self, text, add_special):
        if self.hf:
            return self.hf.encode(text, add_special_tokens=add_special).ids
        ids = self.sp.encode(text)
        return ([self.sp.bos_id()] if add_special and self.sp.bos_id() >= 0 else []) + ids

    def decode(self, ids):
        if self.hf:
            return self.hf.decode(ids, skip_special_tokens=False)
        return self.sp.decode(ids)


def run_runner(runner, tok_path, jsonl, extra):
    cmd = [runner, "--tokenizer", tok_path, "--tokenize-jsonl", jsonl] + extra
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
    return [json.loads(l) for l in p.stdout.decode("utf-8").split("\n") if l.strip()]  # not splitlines(): U+2028 is text


CLASS_PATTERNS = [r"\s", r"[\s]", r"\S", r"\w", r"[\w]", r"\W", r"[^\w\s]", r"\d", r"[\d]", r"\p{L}", r"\p{N}",
                  r"[^\s\p{L}\p{N}]", r"\p{Lu}", r"\p{M}", r"(?i:'s|'ll)", r"\s+(?!\S)"]


def class_parity(runner, tokenizers_dir, tmp, show):
    """Which code points each regex class matches, Oniguruma (the package) vs diffscope's PCRE2 translation:
    for each pattern a tokenizer Split(pattern, removed) + ByteLevel over the GPT-2 test model, run on text made
    of sampled code points (all of Latin-1 and the BMP's common blocks, some astral ones)."""
    base = json.load(open(os.path.join(tokenizers_dir, "gpt2.json"), encoding="utf-8"))
    cps = [c for c in range(0x20, 0x3000) if c != 0x7F] + list(range(0x3000, 0xD800, 7)) + \
          list(range(0xE000, 0x10000, 5)) + list(range(0x10000, 0x20000, 37))
    # Only characters this Python's Unicode (14.0 for 3.11, as Debian 12's PCRE2) assigns: characters added in
    # later versions are classified by the package's newer tables and by PCRE2 as unassigned.
    cps = [c for c in cps if unicodedata.category(chr(c)) != "Cn"]
    chunk = 48
    texts = ["".join(chr(c) for c in cps[i:i + chunk]) for i in range(0, len(cps), chunk)]
    texts += ["'S 'LL 's 'ſ 'K", "a  \n b", "x\u180e y\u00a0 z"]
    jsonl = os.path.join(tmp, "classes.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    total = failed = 0
    for pat in CLASS_PATTERNS:
        data = dict(base)
        data["added_tokens"] = []
        data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Removed", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
        path = os.path.join(tmp, "class.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)
        ref = Tokenizer.from_file(path)
        got = run_runner(runner, path, jsonl, [])
        bad = [(t, ref.encode(t, add_special_tokens=False).ids, g["ids"]) for t, g in zip(texts, got)
               if ref.encode(t, add_special_tokens=False).ids != g["ids"]]
        total += len(texts)
        failed += len(bad)
        print(f"regex class {pat!r}: {len(texts)} strings, {len(bad)} mismatches: {'ok' if not bad else 'MISMATCH'}")
        for t, want, g in bad[:show]:
            kept_ref = ref.pre_tokenizer.pre_tokenize_str(t)
            print(f"  in {t!r}\n    python keeps {[x for x, _ in kept_ref]}")
    return total, failed


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runner", required=True, help="program taking --tokenizer FILE --tokenize-jsonl IN.jsonl")
    ap.add_argument("--tokenizers", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                         "tokenizers"))
    ap.add_argument("--count", type=int, default=3000, help="test strings per tokenizer")
    ap.add_argument("--extended", action="store_true", help="also compare --add-special ids and --decode output")
    ap.add_argument("--show", type=int, default=5, help="mismatches to print per check")
    args = ap.parse_args()

    files = sorted(glob.glob(os.path.join(args.tokenizers, "*.json")) + glob.glob(os.path.join(args.tokenizers, "*.model")))
    if not files:
        print(f"tokenizer_parity: FAILED: no tokenizer files in {args.tokenizers}")
        return 1
    total = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            name = os.path.basename(path)
            ref = Reference(path)
            texts = make_strings(sum(map(ord, name)), args.count, special_fragments(path))
            jsonl = os.path.join(tmp, name + ".jsonl")
            with open(jsonl, "w", encoding="utf-8") as f:
                for t in texts:
                    f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
            checks = [("ids", [], False)]
            if args.extended:
                checks += [("ids+special", ["--add-special"], True)]
            for label, extra, add_special in checks:
                got = run_runner(args.runner, path, jsonl, extra + (["--decode"] if args.extended and not add_special else []))
                if len(got) != len(texts):
                    print(f"{name} [{label}]: runner printed {len(got)} lines for {len(texts)} inputs")
                    failed += len(texts)
                    total += len(texts)
                    continue
                bad = []
                bad_decode = []
                for text, g in zip(texts, got):
                    want = ref.encode(text, add_special)
                    if g["ids"] != want:
                        bad.append((text, want, g["ids"]))
                    elif "decoded" in g and g["decoded"] != ref.decode(want):
                        bad_decode.append((text, ref.decode(want), g["decoded"]))
                total += len(texts) * (2 if "decoded" in got[0] else 1)
                failed += len(bad) + len(bad_decode)
                status = "ok" if not bad and not bad_decode else "MISMATCH"
                print(f"{name} [{label}]: {len(texts)} strings, {len(bad)} id mismatches"
                      + (f", {len(bad_decode)} decode mismatches" if "decoded" in got[0] else "") + f": {status}")
                for text, want, g in bad[:args.show]:
                    i = first_diff(want, g)
                    print(f"  text {text!r}\n    python   {want}\n    diffscope {g}\n    first difference at token {i}")
                for text, want, g in bad_decode[:args.show]:
                    print(f"  decode of {text!r}\n    python   {want!r}\n    diffscope {g!r}")
        t, f = class_parity(args.runner, args.tokenizers, tmp, args.show)
        total += t
        failed += f
    print(f"tokenizer_parity: {total - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
