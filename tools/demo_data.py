"""Data recipe for the diffscope demo models.

Shared by tools/train_demo.py and tools/eval_demo.py. Standard library only (no torch here), so
the generators can be checked anywhere.

Two streams, mixed 50/50 by training chunk:
  * natural text already on the machine: Python standard-library sources (docstrings included),
    the .py / README / METADATA text of a fixed list of installed packages, and /usr/share/doc
    copyright files and changelogs. Files are listed in sorted order, sampled with a seeded
    shuffle and capped per source, so the corpus is a deterministic function of (machine, seed).
  * generated retrieval tasks where attention noise matters:
      - "kv": a list of key -> value records with near-duplicate keys as distractors, then a query;
      - "needle": a fact buried in filler sentences with near-duplicate distractor facts, then a
        question.
    Every task is a (prompt, answer, answer_span) triple: answer_span is the character span of the
    answer inside the prompt's context, used by the evaluation to measure attention-to-answer.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import importlib.util
import os
import random
import re
import sys
import sysconfig
from dataclasses import dataclass

# Packages whose installed text joins the corpus (missing ones are skipped).
SITE_PACKAGES = [
    "torch", "transformers", "tokenizers", "safetensors", "numpy", "huggingface_hub", "jinja2",
    "sympy", "networkx", "filelock", "fsspec", "typing_extensions", "setuptools", "pip", "triton",
    "yaml", "requests", "tqdm", "regex", "packaging", "urllib3", "idna", "certifi", "markupsafe",
    "mpmath", "click", "rich", "pygments", "docutils", "pkg_resources",
]

TEXT_EXT = (".py", ".md", ".rst", ".txt", ".pyi")
MAX_FILE_BYTES = 400_000          # skip generated giants
BOS, EOS = "<|bos|>", "<|eos|>"

# Value words for the retrieval tasks: short common nouns.
WORDS = """
otter cedar maple falcon harbor lantern meadow pepper quartz raven saddle tiger violet walnut
badger canyon dolphin ember fossil glacier hazel island jasmine kettle lemon marble nutmeg orchid
pebble quill river salmon thistle tulip velvet willow yarrow zebra amber beacon cobalt delta
eagle fern garnet heron iris juniper kiwi lotus mango nickel olive parrot quince robin sparrow
topaz umber vapor wombat yucca acorn basil cherry daisy ferret ginger honey indigo jade koala
lilac moss nectar onyx panda radish sage truffle walrus bison camel dragon finch gecko hornet
ibis jaguar lynx moose newt oyster puma rhino shark trout viper wolf yak apple birch clover
dune forest grove hill lake marsh ocean pond reef stone valley wave anchor bell candle drum
flute harp kite mirror needle piano ribbon scroll tower wheel arrow button castle feather
goblet helmet jewel ladder mask pillar rocket shield throne vessel crown barrel cabin copper
silver golden crystal granite iron tin zinc bronze carbon argon neon helium lithium sodium
""".split()

COLORS = ["red", "blue", "green", "black", "white", "yellow", "silver", "orange", "purple", "brown",
          "grey", "golden", "pink", "dark", "bright", "old"]
OBJECTS = ["door", "gate", "box", "chest", "room", "vault", "safe", "locker", "drawer", "cabinet",
           "tower", "bridge", "tunnel", "garden", "house", "boat"]
ATTRS = [("secret word", "word"), ("pass code", "code"), ("magic word", "word"), ("lock number", "code")]

# Haystack sentences of tools/make_needle_prompt.py and tools/make_needle_set.py (their default filler), also
# used for some of the long training haystacks so the demo models answer on those prompts.
HAYSTACK_FILLER_EXTRA = [
    "The bus stops by the post office.", "A dog barks at the passing cars.", "The kettle whistles in the kitchen.",
    "Fishermen mend their nets on the pier.", "The teacher writes on the board.", "Leaves turn red in the autumn.",
    "A bell rings at the end of the lesson.", "The bakery smells of fresh bread.", "Two boys fly a kite on the hill.",
    "The painter mixes colours on a board.", "Waves break against the rocks.", "The shop sells maps and postcards.",
    "A woman reads a book under a tree.", "The garden gate creaks in the wind.", "Clouds gather over the mountains.",
    "The old bridge crosses a narrow stream.", "A cyclist rides along the canal.", "The orchestra tunes its strings.",
    "Frost covers the windows in the morning.", "The farmer counts his sheep at dusk.",
    "Tourists take photos of the cathedral.", "The ferry crosses the lake twice a day.",
    "A candle burns on the kitchen table.", "The postman knows every street in town.",
    "Bees buzz around the flowers in the field.", "The station clock is five minutes fast.",
    "A light rain falls on the quiet square.", "The village holds a fair every summer.",
    "Sailors tie the ropes on the deck.", "The wooden floor creaks at night.", "A young fox crosses the road.",
    "The soup simmers slowly on the stove.", "Stars shine above the dark valley.", "The path leads down to the beach.",
    "A gardener waters the roses every evening.",
]


def haystack_filler() -> list[str]:
    """The built-in haystack sentences: make_needle_prompt.FILLER plus HAYSTACK_FILLER_EXTRA."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        from make_needle_prompt import FILLER
    except ImportError:
        FILLER = []
    out = []
    for s in list(FILLER) + HAYSTACK_FILLER_EXTRA:
        if s not in out:
            out.append(s)
    return out


FALLBACK_FILLER = [
    "The quick brown fox jumps over the lazy dog.",
    "Return the value of the named attribute of the object.",
    "This module provides a simple way to read and write files.",
    "If the argument is omitted, the default value is used instead.",
    "The function raises an error when the input is not valid.",
    "Each item in the list is processed in the order it was added.",
    "A new instance is created for every call to the constructor.",
    "The result is cached so that repeated calls are cheap.",
]


# ----------------------------------------------------------------------------------------------
# Natural-text corpus
# ----------------------------------------------------------------------------------------------
@dataclass
class CorpusSource:
    name: str
    files: int = 0
    bytes: int = 0


def _read_text(path: str) -> str | None:
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return None
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
            if len(raw) > MAX_FILE_BYTES:
                return None
        else:
            with open(path, "rb") as f:
                raw = f.read()
    except OSError:
        return None
    if b"\x00" in raw:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = text.replace("\r\n", "\n").replace("\t", "    ")
    return text if len(text.strip()) >= 64 else None


def _walk_sorted(root: str, exts, skip_dirs=()) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in skip_dirs and not d.startswith(".") and d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith(exts):
                out.append(os.path.join(dirpath, fn))
    return out


def _stdlib_files() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "ensurepip",
            "turtledemo", "config-3", "lib-dynload"}
    return [p for p in _walk_sorted(root, (".py",), skip) if "/config-" not in p]


def _site_files() -> list[str]:
    files: list[str] = []
    seen_roots = set()
    for name in SITE_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.submodule_search_locations:
            roots = sorted(set(spec.submodule_search_locations))
        elif spec.origin and spec.origin.endswith(".py"):
            files.append(spec.origin)
            continue
        else:
            continue
        for r in roots:
            r = os.path.realpath(r)
            if r in seen_roots:
                continue
            seen_roots.add(r)
            files.extend(_walk_sorted(r, TEXT_EXT, {"_vendor", "vendored", "third_party"}))
    return files


def _metadata_texts() -> list[tuple[str, str]]:
    """Long descriptions (usually the README) of installed distributions, sorted by name."""
    out = []
    try:
        dists = sorted(importlib.metadata.distributions(),
                       key=lambda d: (d.metadata.get("Name") or "").lower())
    except Exception:
        return out
    seen = set()
    for d in dists:
        name = (d.metadata.get("Name") or "").lower()
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            body = d.metadata.get_payload() or ""
        except Exception:
            body = ""
        summary = d.metadata.get("Summary") or ""
        text = (f"{name}: {summary}\n\n{body}").strip()
        if len(text) >= 200 and len(text) <= MAX_FILE_BYTES:
            out.append((f"metadata:{name}", text))
    return out


def _doc_files() -> list[str]:
    root = "/usr/share/doc"
    if not os.path.isdir(root):
        return []
    out = []
    for pkg in sorted(os.listdir(root)):
        d = os.path.join(root, pkg)
        if not os.path.isdir(d):
            continue
        for fn in ("copyright", "changelog.Debian.gz", "changelog.gz", "NEWS.Debian.gz", "README.Debian"):
            p = os.path.join(d, fn)
            if os.path.isfile(p) and not os.path.islink(p):
                out.append(p)
    return out


def collect_corpus(total_mb: float, seed: int, log=print) -> tuple[list[str], dict]:
    """Returns (documents, info). Documents come in a deterministic (seeded) order."""
    budget = int(total_mb * 1e6)
    # share of the budget per source; what one source leaves unused goes to the next
    plan = [("stdlib", 0.40, lambda: [(p, None) for p in _stdlib_files()]),
            ("site-packages", 0.40, lambda: [(p, None) for p in _site_files()]),
            ("package-metadata", 0.05, lambda: _metadata_texts()),
            ("usr-share-doc", 0.15, lambda: [(p, None) for p in _doc_files()])]
    docs: list[str] = []
    info = {"sources": [], "total_bytes": 0}
    carry = 0
    for i, (name, share, lister) in enumerate(plan):
        cap = int(budget * share) + carry
        items = lister()
        rng = random.Random(f"{seed}:{name}")
        rng.shuffle(items)
        src = CorpusSource(name)
        for path, text in items:
            if src.bytes >= cap:
                break
            if text is None:
                text = _read_text(path)
                if text is None:
                    continue
            if src.bytes + len(text) > cap * 1.02 + 1000:
                continue
            docs.append(text)
            src.files += 1
            src.bytes += len(text)
        carry = max(0, cap - src.bytes)
        info["sources"].append({"name": name, "files": src.files, "bytes": src.bytes,
                                "candidates": len(items)})
        log(f"  corpus source {name:18s}: {src.files:6d} files, {src.bytes / 1e6:7.2f} MB "
            f"(of {len(items)} candidates)")
    rng = random.Random(f"{seed}:docs")
    rng.shuffle(docs)
    h = hashlib.sha256()
    for d in docs:
        h.update(d.encode("utf-8", "replace"))
    info["total_bytes"] = sum(len(d) for d in docs)
    info["sha256"] = h.hexdigest()
    info["documents"] = len(docs)
    return docs, info


_SENT = re.compile(r"^[A-Z][a-z]+(?: [A-Za-z][A-Za-z,'()-]*){4,24}\.$")


def filler_sentences(docs: list[str], seed: int, limit: int = 40_000) -> list[str]:
    """Prose-like lines (docstrings, comments, licence text) used as haystack filler."""
    seen = set()
    for d in docs:
        for line in d.split("\n"):
            s = line.strip().lstrip("#").strip()
            if 30 <= len(s) <= 160 and _SENT.match(s) and s not in seen:
                seen.add(s)
    pool = sorted(seen)
    rng = random.Random(f"{seed}:filler")
    rng.shuffle(pool)
    pool = pool[:limit]
    return pool if len(pool) >= 50 else pool + FALLBACK_FILLER


# ----------------------------------------------------------------------------------------------
# Retrieval tasks
# ----------------------------------------------------------------------------------------------
@dataclass
class Task:
    kind: str             # "kv" or "needle"
    prompt: str           # ends right before the answer (the query token is the prompt's last)
    answer: str           # starts with a space, e.g. " otter"
    span: tuple           # [start, end) character span of the answer inside the prompt's context
    question_start: int   # character offset where the question/query segment begins
    extra: str = ""       # training only: further queries with their answers, after the answer


def _near_keys(rng: random.Random, key: int, k: int, taken: set) -> list[int]:
    s = f"{key:04d}"
    out = []
    tries = 0
    while len(out) < k and tries < 200:
        tries += 1
        if rng.random() < 0.5:        # change one digit
            i = rng.randrange(4)
            t = s[:i] + str(rng.randrange(10)) + s[i + 1:]
        else:                          # swap two adjacent digits
            i = rng.randrange(3)
            t = s[:i] + s[i + 1] + s[i] + s[i + 2:]
        v = int(t)
        if v >= 1000 and v not in taken:
            taken.add(v)
            out.append(v)
    return out


def make_kv(rng: random.Random, words: list[str], n_pairs: int, n_near: int,
            extra_queries: int = 0) -> Task:
    taken: set = set()
    target = rng.randrange(1000, 10000)
    taken.add(target)
    keys = [target] + _near_keys(rng, target, n_near, taken)
    while len(keys) < n_pairs:
        k = rng.randrange(1000, 10000)
        if k not in taken:
            taken.add(k)
            keys.append(k)
    rng.shuffle(keys)
    vals = [rng.choice(words) for _ in keys]
    # the target's value must be unique in the list, else the span is ambiguous
    tv = vals[keys.index(target)]
    for i, k in enumerate(keys):
        if k != target and vals[i] == tv:
            vals[i] = rng.choice([w for w in words if w != tv])
    parts = ["records:"]
    pos = len(parts[0])
    span = None
    for k, v in zip(keys, vals):
        piece = f" {k} -> {v};"
        if k == target:
            a = pos + len(f" {k} ->")
            span = (a, a + 1 + len(v))
        parts.append(piece)
        pos += len(piece)
    ctx = "".join(parts)
    q = f" query: {target} ->"
    t = Task("kv", ctx + q, f" {tv}", span, len(ctx))
    for _ in range(extra_queries):   # training only: more retrieval targets per example
        i = rng.randrange(len(keys))
        t.extra += f"; query: {keys[i]} -> {vals[i]}"
    return t


def make_needle(rng: random.Random, words: list[str], filler: list[str], n_filler: int,
                n_distract: int, extra_queries: int = 0) -> Task:
    attr, kind = rng.choice(ATTRS)
    color, obj = rng.choice(COLORS), rng.choice(OBJECTS)

    def value():
        return f"{rng.randrange(1000, 10000)}" if kind == "code" else rng.choice(words)

    ans = value()
    # near-duplicate distractors: same colour other object, same object other colour, other attr
    subjects = set()
    distract = []
    facts_meta = []
    tries = 0
    while len(distract) < n_distract and tries < 100:
        tries += 1
        r = rng.random()
        c2 = color if r < 0.4 else rng.choice(COLORS)
        o2 = obj if 0.4 <= r < 0.8 else rng.choice(OBJECTS)
        a2 = attr if r < 0.9 else rng.choice(ATTRS)[0]
        if (c2, o2, a2) == (color, obj, attr) or (c2, o2, a2) in subjects:
            continue
        v2 = value()
        if v2 == ans:
            continue
        subjects.add((c2, o2, a2))
        distract.append(f"The {a2} of the {c2} {o2} is {v2}.")
        facts_meta.append((a2, c2, o2, v2))
    facts = [None] + distract            # None marks the needle
    rng.shuffle(facts)
    body = [rng.choice(filler) for _ in range(n_filler)]
    # every fact goes before one of the n_filler + 1 gaps' positions (several may share a gap)
    at = sorted(rng.randrange(n_filler + 1) for _ in facts)
    pieces: list = []
    fi = 0
    for i in range(n_filler + 1):
        while fi < len(facts) and at[fi] == i:
            pieces.append(facts[fi])
            fi += 1
        if i < n_filler:
            pieces.append(body[i])
    text = ""
    span = None
    for p in pieces:
        sep = " " if text else ""
        if p is None:
            pre = f"{sep}The {attr} of the {color} {obj} is"
            a = len(text) + len(pre)
            span = (a, a + 1 + len(ans))
            text += pre + f" {ans}."
        else:
            text += sep + p
    q = f" Question: what is the {attr} of the {color} {obj}? Answer:"
    t = Task("needle", text + q, f" {ans}", span, len(text))
    facts_all = [(attr, color, obj, ans)] + facts_meta
    for _ in range(extra_queries):   # training only: also ask about the distractors
        a2, c2, o2, v2 = rng.choice(facts_all)
        t.extra += f". Question: what is the {a2} of the {c2} {o2}? Answer: {v2}"
    if extra_queries:
        t.extra += "."
    return t


def make_task(rng: random.Random, words: list[str], filler: list[str], max_chars: int,
              kind: str | None = None, max_extra: int = 0, long: bool = False) -> Task:
    """One random task whose prompt+answer is at most about max_chars characters (plus, when
    max_extra > 0, 0..max_extra further queries with answers for training)."""
    kind = kind or ("kv" if rng.random() < 0.5 else "needle")
    extra = rng.randint(0, max_extra) if max_extra else 0
    if kind == "kv":
        # one record is ~14 characters, one extra query ~24
        hi = max(4, min(80, (max_chars - 40 - 24 * extra) // 14))
        n = rng.randint(max(4, int(0.7 * hi)) if long else 4, hi)
        return make_kv(rng, words, n, rng.randint(1, 4), extra)
    # one filler sentence is ~70 characters, one fact ~40, one extra question ~70
    nd = rng.randint(1, 5)
    hi = max(1, (max_chars - 80 - 45 * (nd + 1) - 70 * extra) // 75)
    return make_needle(rng, words, filler, rng.randint(max(1, int(0.7 * hi)) if long else 1, hi), nd,
                       extra)


# ----------------------------------------------------------------------------------------------
# Multi-needle facts and long haystacks (tools/make_needle_set.py uses the same templates)
# ----------------------------------------------------------------------------------------------
VALUE_KIND = dict(ATTRS)   # attribute -> "word" or "code"


def fact_text(attr: str, color: str, obj: str, value: str) -> str:
    """A needle: 'The secret word of the blue door is otter.' (value without its leading space)."""
    return f"The {attr} of the {color} {obj} is {value}."


def fact_prefix(attr: str, color: str, obj: str) -> str:
    """The fact up to its value: the answer span starts right after it (at the space before the value)."""
    return f"The {attr} of the {color} {obj} is"


def question_text(attr: str, color: str, obj: str) -> str:
    """The question that ends a needle prompt (with its leading space); the answer follows: ' otter'."""
    return f" Question: what is the {attr} of the {color} {obj}? Answer:"


def draw_value(rng: random.Random, attr: str, words: list[str]) -> str:
    return f"{rng.randrange(1000, 10000)}" if VALUE_KIND[attr] == "code" else rng.choice(words)


def near_miss(rng: random.Random, subj: tuple, taken: set) -> tuple | None:
    """A subject (attr, colour, object) that differs from subj in exactly one field: the colour, the object,
    or the attribute (another of the same value kind when there is one). None when none is left."""
    attr, color, obj = subj
    same_kind = [a for a, k in ATTRS if k == VALUE_KIND[attr] and a != attr]
    cands = ([(attr, c, obj) for c in COLORS if c != color] + [(attr, color, o) for o in OBJECTS if o != obj]
             + [(a, color, obj) for a in (same_kind or [a for a, _ in ATTRS if a != attr])])
    cands = [c for c in cands if c not in taken]
    return rng.choice(cands) if cands else None


def other_subject(rng: random.Random, subj: tuple, taken: set, tries: int = 200) -> tuple | None:
    """A subject that differs from subj in at least two of its three fields (another needle, not a near miss)."""
    for _ in range(tries):
        c = (rng.choice(ATTRS)[0], rng.choice(COLORS), rng.choice(OBJECTS))
        if c not in taken and sum(x != y for x, y in zip(c, subj)) >= 2:
            return c
    return None


def fact_set(rng: random.Random, words: list[str], n_needles: int, n_distract: int,
             attr: str | None = None) -> list[tuple]:
    """[(role, (attr, colour, object), value)]: the queried needle first ('query'), n_needles - 1 other needles
    ('needle'), n_distract near misses of the queried one ('distractor'). Subjects and values are all distinct.
    Raises ValueError when the templates run out of subjects or values."""
    attr = attr or rng.choice(ATTRS)[0]
    q = (attr, rng.choice(COLORS), rng.choice(OBJECTS))
    taken = {q}
    used_vals = set()

    def value(a):
        for _ in range(1000):
            v = draw_value(rng, a, words)
            if v not in used_vals:
                used_vals.add(v)
                return v
        raise ValueError("not enough distinct values for %d facts" % (n_needles + n_distract))

    out = [("query", q, value(attr))]
    for role, n, pick in (("needle", n_needles - 1, other_subject), ("distractor", n_distract, near_miss)):
        for _ in range(n):
            s = pick(rng, q, taken)
            if s is None:
                raise ValueError(f"no subject left for another {role} (have {len(out)} facts)")
            taken.add(s)
            out.append((role, s, value(s[0])))
    return out


def make_long_needle(rng: random.Random, words: list[str], filler: list[str], n_filler: int,
                     n_needles: int, n_distract: int, extra_queries: int = 0, edge_prob: float = 0.2) -> Task:
    """Multi-needle retrieval in a long haystack: n_needles facts with distinct subjects (one queried) and
    n_distract near misses of the queried one, each at a uniformly random depth among n_filler filler sentences
    (the queried one, with probability edge_prob, at the very start or end instead), then the question. Training
    examples (extra_queries > 0) go on to ask about other facts of the haystack."""
    facts = fact_set(rng, words, n_needles, n_distract)
    body = [rng.choice(filler) for _ in range(n_filler)]

    def gap(i):
        if i == 0 and rng.random() < edge_prob:
            return rng.choice((0, n_filler))
        return rng.randrange(n_filler + 1)

    at = sorted((gap(i), i) for i in range(len(facts)))
    text = ""
    span = None
    fi = 0
    for g in range(n_filler + 1):
        while fi < len(at) and at[fi][0] == g:
            role, (a, c, o), v = facts[at[fi][1]]
            pre = ("" if not text else " ") + fact_prefix(a, c, o)
            if role == "query":
                b = len(text) + len(pre)
                span = (b, b + 1 + len(v))
            text += pre + f" {v}."
            fi += 1
        if g < n_filler:
            text += (" " if text else "") + body[g]
    role, (a, c, o), v = facts[0]
    t = Task("needle", text + question_text(a, c, o), f" {v}", span, len(text))
    for _ in range(extra_queries):
        _, (a, c, o), v = rng.choice(facts)
        t.extra += "." + question_text(a, c, o) + f" {v}"
    if extra_queries:
        t.extra += "."
    return t


def long_task(rng: random.Random, words: list[str], corpus_filler: list[str], simple_filler: list[str],
              max_chars: int, min_chars: int, max_extra: int = 0, simple_frac: float = 0.35) -> Task:
    """One long multi-needle task of about min_chars..max_chars characters (1-8 needles, 0-6 near misses, 0..max_extra
    extra queries), its haystack either corpus sentences or the built-in simple filler (simple_frac of them)."""
    filler = simple_filler if rng.random() < simple_frac else corpus_filler
    per = sum(len(f) + 1 for f in filler[:200]) / max(1, min(200, len(filler)))
    n_needles, n_distract = rng.randint(1, 8), rng.randint(0, 6)
    extra = rng.randint(0, max_extra) if max_extra else 0
    chars = rng.randint(min_chars, max(min_chars, max_chars))
    fixed = 45 * (n_needles + n_distract) + 70 * (extra + 1)
    n_filler = max(1, int((chars - fixed) / per))
    return make_long_needle(rng, words, filler, n_filler, n_needles, n_distract, extra)


def long_kv_task(rng: random.Random, words: list[str], max_chars: int, min_chars: int, max_extra: int = 0) -> Task:
    """A long key-value lookup: as many records as fill about min_chars..max_chars characters (1-4 near-duplicate
    keys of the queried one among them), then the query."""
    extra = rng.randint(0, max_extra) if max_extra else 0
    chars = rng.randint(min_chars, max(min_chars, max_chars))
    n = max(4, min(8000, (chars - 40 - 24 * extra) // 14))
    return make_kv(rng, words, n, rng.randint(1, 4), extra)


def task_text(t: Task) -> str:
    return t.prompt + t.answer + t.extra


# Training examples carry up to this many further queries after the first (denser retrieval
# signal); evaluation prompts have exactly one, so they are a prefix of the training format.
TRAIN_EXTRA_QUERIES = 4


def task_stream(seed, words: list[str], filler: list[str], n: int, max_chars: int,
                max_extra: int = TRAIN_EXTRA_QUERIES):
    rng = random.Random(seed)
    for _ in range(n):
        yield task_text(make_task(rng, words, filler, max_chars, max_extra=max_extra))


def eval_tasks(seed: int, words: list[str], filler: list[str], n_per_kind: int,
               max_chars: int) -> list[Task]:
    """Held-out evaluation prompts: long contexts (about 50-100% of max_chars), one query each."""
    rng = random.Random(seed)
    out = []
    for kind in ("kv", "needle"):
        for _ in range(n_per_kind):
            out.append(make_task(rng, words, filler, max_chars, kind, long=True))
    return out


if __name__ == "__main__":   # quick look at the recipe
    docs, info = collect_corpus(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0, 0)
    print(info)
    fil = filler_sentences(docs, 0)
    print(len(fil), fil[:3])
    r = random.Random(1)
    for k in ("kv", "needle"):
        t = make_task(r, WORDS, fil, 900, k)
        print(repr(t.prompt[-300:]), repr(t.answer), repr(t.prompt[t.span[0]:t.span[1]]))
