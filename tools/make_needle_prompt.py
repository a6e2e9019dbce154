#!/usr/bin/env python3
"""A needle-in-a-haystack prompt of an exact number of tokens, for long-context runs of the GUI and the engine.

    tools/make_needle_prompt.py OUT.txt [--tokens 32768] [--tokenizer DIR_OR_tokenizer.json] [--depth 0.5]

Filler sentences (picked by a seeded generator, so the text does not repeat with one period), "The secret number is
7421." at --depth of the filler, and a question at the end whose answer is the next token:
"... What is the secret number? The secret number is". The length counts the tokens the engine runs on the text,
special tokens (BOS) included, with the tokenizer given (default: the demo model's, which make_random_checkpoint.py
ships). Counting uses the `tokenizers` package when it is there, else diffscope-run --tokenize-jsonl (--diffscope-run
PATH); with neither it stops. One trailing newline is not written (the GUI's --prompt-file drops one anyway).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FILLER = [
    "The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.",
    "The river runs past the old mill.", "A small boat drifts along the bank.", "Children play in the park.",
    "The baker opens his shop at six.", "Rain falls softly on the roof.", "The train leaves from platform four.",
    "Birds sing in the tall trees.", "A cat sleeps on the warm stones.", "The market is busy on Saturdays.",
    "Snow covers the distant hills.", "The library closes early today.", "A gentle wind moves the curtains.",
    "The road winds through the valley.", "Old friends meet at the corner cafe.", "The clock in the square chimes.",
    "Apples ripen in the orchard.", "The lighthouse blinks across the bay.", "A farmer walks behind his plough.",
    "The museum shows paintings of the sea.", "Lanterns glow along the harbour wall.",
]
NEEDLE = "The secret number is 7421."
QUESTION = "What is the secret number? The secret number is"


class Counter:
    """Token count of a text as the engine runs it (special tokens added)."""

    def __init__(self, tok_json, diffscope_run):
        self.tok = None
        self.tok_json, self.run = tok_json, diffscope_run
        try:
            from tokenizers import Tokenizer
            self.tok = Tokenizer.from_file(tok_json)
            self.how = "tokenizers " + __import__("tokenizers").__version__
        except Exception as e:  # noqa: BLE001 - any failure: fall back to the engine's tokenizer
            if not diffscope_run:
                sys.exit(f"make_needle_prompt: cannot import tokenizers ({e}); give --diffscope-run PATH")
            self.how = diffscope_run + " --tokenize-jsonl"

    def __call__(self, text):
        if self.tok is not None:
            return len(self.tok.encode(text, add_special_tokens=True).ids)
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write(json.dumps({"text": text}) + "\n")
        try:
            out = subprocess.run([self.run, "--tokenizer", self.tok_json, "--tokenize-jsonl", f.name, "--add-special"],
                                 check=True, capture_output=True, text=True).stdout
        finally:
            os.unlink(f.name)
        return len(json.loads(out.splitlines()[0])["ids"])


def build(words_before, words_after):
    return " ".join(words_before + [NEEDLE] + words_after + [QUESTION])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=32768, help="total tokens, BOS included (default 32768)")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "assets", "models", "diffllama-demo"),
                    help="a model folder or its tokenizer.json (default: the demo model's)")
    ap.add_argument("--depth", type=float, default=0.5, help="where the needle sits in the filler (0..1)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--diffscope-run", default="", help="count with this diffscope-run when tokenizers is missing")
    a = ap.parse_args()
    tok_json = os.path.join(a.tokenizer, "tokenizer.json") if os.path.isdir(a.tokenizer) else a.tokenizer
    count = Counter(tok_json, a.diffscope_run)

    rng = random.Random(a.seed)
    # Filler as a word list: sentences picked at random, then trimmed word by word to the exact length.
    per = max(1, count(" ".join(FILLER)) // len(FILLER))
    sentences = [rng.choice(FILLER) for _ in range(a.tokens // per + 8)]
    words = " ".join(sentences).split(" ")
    lo, hi = 0, len(words)  # largest filler prefix whose prompt fits in a.tokens (the count grows with the prefix)

    def prompt(k):
        cut = int(round(k * a.depth))
        return build(words[:cut], words[cut:k])

    while count(prompt(hi)) < a.tokens:  # not enough filler: add more
        words += " ".join(rng.choice(FILLER) for _ in range(len(FILLER))).split(" ")
        hi = len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(prompt(mid)) <= a.tokens:
            lo = mid
        else:
            hi = mid - 1
    text = prompt(lo)
    n = count(text)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"{a.out}: {n} tokens ({count.how}), {len(text)} characters, needle at {a.depth:.2f} of the filler"
          + ("" if n == a.tokens else f" (no filler length gives exactly {a.tokens})"))


if __name__ == "__main__":
    main()
