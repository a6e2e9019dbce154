# %% [markdown]
# # Noise cancellation in differential attention
#
# A differential attention head (Ye et al. 2024, *Differential Transformer*) computes two softmax maps, A1 and A2,
# and attends with their difference A1 − λ·A2. The idea: both maps spend some mass on irrelevant context (the
# "attention noise"); subtracting A2 cancels the common part and keeps the signal.
#
# This notebook looks for that on the shipped demo models: `diffllama-demo` (6 layers × 4 differential heads)
# and its Transformer twin `llama-demo` (same data and steps, 8 softmax heads). We build a needle prompt, read
# the attention row of its last token, move λ, and compare with the twin.
#
# Run it in Jupyter (jupytext opens this file as a notebook) or as a script:
# `python examples/noise_cancellation.py --out DIR` writes the figures as PNGs into DIR.

# %%
import argparse
import random
import re
import sys
from pathlib import Path

import matplotlib
import numpy as np

IN_NOTEBOOK = "ipykernel" in sys.modules
if not IN_NOTEBOOK:
    matplotlib.use("Agg")  # a script only writes files
import matplotlib.pyplot as plt

import diffscope

parser = argparse.ArgumentParser(description="Noise cancellation in the demo DiffLlama", allow_abbrev=False)
parser.add_argument("--out", default="examples_out", help="folder for the PNGs (default: examples_out)")
args, _ = parser.parse_known_args()  # Jupyter passes its own flags: ignore them
OUT = Path(args.out)
OUT.mkdir(parents=True, exist_ok=True)


def find_root() -> Path:
    """The repository root: the folder with assets/models/diffllama-demo, above this file or the cwd."""
    starts = [Path.cwd()] + ([Path(__file__).resolve().parent] if "__file__" in globals() else [])
    for start in starts:
        for d in [start, *start.parents]:
            if (d / "assets/models/diffllama-demo/config.json").is_file():
                return d
    sys.exit("cannot find assets/models/diffllama-demo: run from inside the diffscope repository")


def save(fig, name: str) -> None:
    path = OUT / name
    fig.savefig(path, dpi=120, bbox_inches="tight")
    assert path.is_file() and path.stat().st_size > 0, path
    print("wrote", path)
    if not IN_NOTEBOOK:
        plt.close(fig)


ROOT = find_root()
MODELS = ROOT / "assets/models"
diff = diffscope.open(MODELS / "diffllama-demo", backend="cpu")
twin = diffscope.open(MODELS / "llama-demo", backend="cpu")
print(diff)
print(twin)

# %% [markdown]
# ## A needle prompt
#
# Filler sentences (the haystack of the GUI's default prompt) in a seeded order, four facts in them, and a
# question about one of them. Two facts are *near misses* of the queried one (another colour, another object),
# one is unrelated. We keep the character span of the queried value (` otter`) and map it to token positions
# through the byte spans of `Session.tokens` (the prompt is ASCII, so characters and bytes coincide).

# %%
SEED, N_SENTENCES = 0, 140  # about 1,100 tokens
QUERY = ("The secret word of the blue door is", " otter")
OTHERS = [(0.20, "The secret word of the blue gate is cedar."),    # near miss (object)
          (0.35, "The pass code of the black box is 4821."),      # unrelated fact
          (0.75, "The secret word of the green door is maple.")]  # near miss (colour)
DEPTH = 0.5  # where the queried fact sits in the haystack
QUESTION = " Question: what is the secret word of the blue door? Answer:"

default = (MODELS / "default_prompt.txt").read_text().strip()
fact = re.compile(r"^The (secret word|magic word|pass code|lock number) of ")
filler = list(dict.fromkeys(s for s in re.split(r"(?<=\.) ", default.split(" Question:")[0]) if not fact.match(s)))
rng = random.Random(SEED)
hay = [rng.choice(filler) for _ in range(N_SENTENCES)]
for depth, sentence in sorted(OTHERS + [(DEPTH, "".join(QUERY) + ".")], reverse=True):
    hay.insert(round(depth * len(hay)), sentence)
text = " ".join(hay) + QUESTION

needle = "".join(QUERY) + "."
ans_chars = (text.index(needle) + len(QUERY[0]), text.index(needle) + len(QUERY[0]) + len(QUERY[1]))
diff.run(text)
twin.run(text)
tokens = diff.tokens
assert [t.id for t in tokens] == [t.id for t in twin.tokens], "the twins share one tokenizer"


def token_span(b: int, e: int) -> tuple:
    """[first, last + 1) of the tokens overlapping the characters [b, e) of the prompt."""
    hit = [i for i, t in enumerate(tokens) if not t.special and t.end > b and t.begin < e]
    return hit[0], hit[-1] + 1


ANS = token_span(*ans_chars)
NEEDLE = token_span(text.index(needle), text.index(needle) + len(needle))
DISTRACTORS = [token_span(text.index(s), text.index(s) + len(s)) for _, s in OTHERS]
Q0 = token_span(len(text) - len(QUESTION), len(text))[0]  # the question's first token
TARGET = tokens[ANS[0]].id  # the answer's first token: what the model should say next
print(f"{len(tokens)} tokens; answer {[tokens[i].text for i in range(*ANS)]} at tokens {ANS}, "
      f"question from token {Q0}")
for name, sess in (("DiffLlama", diff), ("Llama twin", twin)):
    print(f"{name:>10}: " + ", ".join(f"{t.text!r} {t.prob:.3f}" for t in sess.top_k(5)))

# %% [markdown]
# ## The answer row: A1, A2 and A1 − λ·A2
#
# The last prompt token (`:` of `Answer:`) is where the model must fetch the answer. Its attention row over
# all keys, averaged over the heads of the layer `default_head.txt` names (the GUI's retrieval layer). The
# queried fact is shaded (its value darker), the other facts hatched, the question green. Panel titles give the
# row's mass on the answer and on the haystack (keys before the question, less the BOS sink and the answer).
#
# What to look for: A1 peaks on the answer (and on the question, a little on the other facts); A2 puts almost
# nothing on the answer and spreads over the haystack and the question, so subtracting λ·A2 removes the
# haystack's mass (here slightly over-cancelled: negative) while the answer's peak stays.

# %%
LAYER = int((MODELS / "default_head.txt").read_text().split(".")[0])
lam = float(diff.lambdas.effective[LAYER])
r = diff.rows(-1, layers=[LAYER])
a1, a2 = r.a1[0, :, 0].mean(0), r.a2[0, :, 0].mean(0)  # [n]: head means
d = a1 - lam * a2
assert all(np.isfinite(x).all() for x in (a1, a2, d))


def shade(ax):
    ax.axvspan(NEEDLE[0] - 0.5, NEEDLE[1] - 0.5, color="tab:orange", alpha=0.2, lw=0)
    ax.axvspan(ANS[0] - 0.5, ANS[1] - 0.5, color="tab:orange", alpha=0.6, lw=0, label="queried fact / answer")
    for k, (b, e) in enumerate(DISTRACTORS):
        ax.axvspan(b - 0.5, e - 0.5, fc="none", ec="tab:gray", hatch="///", lw=0,
                   label="other facts" if k == 0 else None)
    ax.axvspan(Q0 - 0.5, len(tokens) - 0.5, color="tab:green", alpha=0.12, lw=0, label="question")


fig, axes = plt.subplots(3, 1, figsize=(11, 7), sharex=True)
for ax, y, title in zip(axes, (a1, a2, d), ("A1", "A2", f"A1 − λ·A2 (λ = {lam:.2f})")):
    shade(ax)
    ax.plot(np.arange(len(y)), y, lw=0.8, color="k")
    ax.axhline(0, color="gray", lw=0.5)
    ax.set_ylabel("attention")
    ax.set_title(f"{title}: answer {y[slice(*ANS)].sum():+.3f}, haystack {y[1:Q0].sum() - y[slice(*ANS)].sum():+.3f}",
                 loc="left", fontsize=10)
axes[0].legend(loc="upper left", fontsize=8)
axes[-1].set_xlabel("key position (token)")
fig.suptitle(f"DiffLlama layer {LAYER}, last token's row (mean of {diff.heads} heads)")
save(fig, "answer_row.png")

# %% [markdown]
# ## Sweeping λ
#
# Two sweeps, both as a multiple of the trained λ: scaling **every** layer's λ (`lambda_scale`), and setting
# λ of layer `LAYER` **alone** (`set_lambda`; the layers below are untouched, so A1 and A2 of that layer stay
# the same and only their difference moves). For each we record the answer's share of the row,
# mass(D on answer) / Σ|D| (a plain softmax row gives its answer mass; dividing by ΣD instead would blow up as
# λ → 1, where ΣD = 1 − λ → 0), the haystack's share, and log p(answer).
#
# What to look for: scaling every layer's λ away from the trained one hurts the answer on both sides (at 0 the
# network is a plain Transformer it was never trained as, and the retrieval layer no longer finds the needle);
# moving one layer's λ alone is gentler. In that layer the haystack's share falls steadily, through zero, as λ
# grows, while the answer's share falls only slowly; log p(answer) peaks near the trained λ.

# %%
SCALES = np.round(np.arange(0.0, 1.51, 0.125), 3)


def shares(s, layer, lam=None):
    """Per head: the (answer, haystack) mass of the last row of D = A1 - lam*A2 (a plain model: its one map) over
    the row's sum of |D|. lam: default the layer's lambda in the run; the haystack is everything before the
    question but the sink and the answer."""
    row = s.rows(-1, layers=[layer])
    x = row.a1[0, :, 0].astype(np.float64)
    if s.differential:
        x = x - (s.lambdas.effective[layer] if lam is None else lam) * row.a2[0, :, 0]
    ans = x[:, slice(*ANS)].sum(1)
    hay = x[:, 1:Q0].sum(1) - ans
    if lam is None:  # the engine's own split of the row (column 2: D) agrees
        assert np.allclose(s.row_mass(layer, -1, ANS)["answer"][:, 2], ans, atol=1e-4)
    total = np.abs(x).sum(1)
    return ans / total, hay / total


sweep = {}
lam0 = float(diff.lambdas.model[LAYER])
for mode in ("every layer", f"layer {LAYER} alone"):
    out = []
    for x in SCALES:
        diff.reset_lambda()
        if mode == "every layer":
            diff.lambda_scale = float(x)
        else:
            diff.set_lambda(LAYER, float(x * lam0))
        diff.run()
        ans, hay = shares(diff, LAYER)
        out.append((ans.mean(), hay.mean(), float(diff.logprobs()[TARGET])))
    sweep[mode] = np.array(out)
    assert np.isfinite(sweep[mode]).all()
diff.reset_lambda()
diff.run()

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
for (mode, v), c in zip(sweep.items(), ("tab:blue", "tab:red")):
    ax1.plot(SCALES, v[:, 0], "o-", color=c, label=f"answer, {mode}")
    ax1.plot(SCALES, v[:, 1], "s--", color=c, alpha=0.6, label=f"haystack, {mode}")
    ax2.plot(SCALES, v[:, 2], "o-", color=c, label=mode)
for ax in (ax1, ax2):
    ax.axvline(1.0, color="gray", ls=":", lw=1)
    ax.axhline(0, color="gray", lw=0.5)
    ax.set_xlabel("λ / trained λ   (0: A1 alone)")
    ax.legend(fontsize=8)
ax1.set_ylabel("share of Σ|A1 − λ·A2|")
ax1.set_title(f"layer {LAYER} (mean of heads), last token's row", fontsize=10)
ax2.set_ylabel(f"log p({tokens[ANS[0]].text!r})")
ax2.set_title("the answer's log-probability", fontsize=10)
save(fig, "lambda_sweep.png")
for mode, v in sweep.items():
    print(f"{mode}: " + "  ".join(f"{x:g}: {lp:+.2f}" for x, lp in zip(SCALES, v[:, 2])))

# %% [markdown]
# ## The Transformer twin
#
# The twin has one softmax map per head. Per layer, the answer's and the haystack's share of the last row (bars:
# mean of heads; ticks: the best head) for the twin's map, the DiffLlama's A1 alone (λ = 0, read from the same
# run) and its A1 − λ·A2 (over Σ|D|, as above). The twin does retrieve (one layer has a head on the needle), but
# most of its layers' rows keep most of their mass on the haystack; the DiffLlama's A1 keeps less, and its
# difference maps less again, down to zero or below (negative: A2 outweighs A1 there). The two have the same width, depth, data and steps, but not the same
# number of heads (8 vs 4 differential), so compare shares, not sums over heads.

# %%
layers = diff.map_layers
cmp = {"Llama twin (softmax)": [shares(twin, l) for l in layers],
       "DiffLlama A1 alone": [shares(diff, l, lam=0.0) for l in layers],
       "DiffLlama A1 − λ·A2": [shares(diff, l) for l in layers]}
mean = {k: np.array([(a.mean(), h.mean()) for a, h in v]) for k, v in cmp.items()}  # [layers, 2]
best = {k: np.array([a.max() for a, _ in v]) for k, v in cmp.items()}  # the best head's answer share

fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
w = 0.27
for j, (what, ax) in enumerate(zip(("answer", "haystack (noise)"), axes)):
    for i, name in enumerate(cmp):
        x = np.array(layers) + (i - 1) * w
        ax.bar(x, mean[name][:, j], w, label=name, color=f"C{i}")
        if j == 0:
            ax.scatter(x, best[name], marker="_", s=120, color="k", label="best head" if i == 2 else None)
    ax.axhline(0, color="gray", lw=0.5)
    ax.set_xticks(layers)
    ax.set_xlabel("layer")
    ax.set_title(f"{what}: share of the last token's row", fontsize=10)
axes[0].set_ylabel("share of Σ|row| (bars: mean of heads)")
fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=9, bbox_to_anchor=(0.5, -0.07))
save(fig, "twin_comparison.png")

print("answer share, mean of heads (best head) / haystack share, mean of heads")
print(f"{'layer':>5} " + " ".join(f"{k:>27}" for k in cmp))
for i, l in enumerate(layers):
    print(f"{l:>5} " + " ".join(f"{mean[k][i, 0]:+.3f} ({best[k][i]:+.3f}) / {mean[k][i, 1]:+.3f}" for k in cmp))
for k, v in mean.items():
    assert np.isfinite(v).all() and np.isfinite(best[k]).all()
