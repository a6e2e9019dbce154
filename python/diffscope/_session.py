"""The Session: one model on one backend, its prompt, lambda controls and the latest results."""
from __future__ import annotations

import json
import math
import os
from typing import Iterator, NamedTuple, Optional, Sequence, Union

import numpy as np

from . import _diffscope as _native
from ._diffscope import Error, Maps, Rows, View

PromptLike = Union[str, Sequence[int], np.ndarray]

# The statistics of Session.stats(), in the order the engine returns them (engine/core/map_query.h HeadStats).
_STAT_KEYS = ("entropy1", "entropy2", "entropy_diff", "first1", "first2", "first_diff", "neg_mass", "diff_min",
              "diff_max", "max_logit1", "max_logit2")
_MAP2_KEYS = ("entropy2", "first2", "max_logit2")  # absent for plain (single-softmax) models, as in --stats


class Token(NamedTuple):
    """A next-token candidate (Session.top_k) or a generated token (prob and logit NaN there)."""
    id: int
    prob: float
    logit: float
    text: str


class TokenInfo(NamedTuple):
    """One position of the sequence: its id, display text, byte span in the prompt and whether it is special."""
    id: int
    text: str
    begin: int
    end: int
    special: bool


class Lambdas(NamedTuple):
    """Per layer: the checkpoint's lambda, the one the next run uses, and the user's override (None: none)."""
    model: np.ndarray
    effective: np.ndarray
    override: list
    scale: float


class Stats:
    """Per attention layer and view head: the statistics of diffscope-run --stats (engine/core/map_query.h).

    stats["entropy_diff"] is a [layers, heads] float32 array; stats.layers the model's layer indices; to_records()
    one dict per (layer, head), which pandas.DataFrame takes directly.
    """

    def __init__(self, layers, values: np.ndarray, differential: bool, lambdas: np.ndarray, kinds: list,
                 max_abs_hidden: Optional[np.ndarray]):
        self.layers = np.asarray(layers, dtype=np.int64)
        self.differential = differential
        self.lambda_ = lambdas
        self.kinds = kinds
        self.max_abs_hidden = max_abs_hidden
        self._values = values  # [layers, heads, 11]
        self.keys = tuple(k for k in _STAT_KEYS if differential or k not in _MAP2_KEYS)

    @property
    def heads(self) -> int:
        return int(self._values.shape[1])

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self.keys:
            raise KeyError(f"{key!r} is not a statistic of this model (keys: {', '.join(self.keys)})")
        return self._values[:, :, _STAT_KEYS.index(key)]

    def __contains__(self, key: str) -> bool:
        return key in self.keys

    def to_records(self) -> list:
        out = []
        for i, layer in enumerate(self.layers):
            for h in range(self.heads):
                r = {"layer": int(layer), "head": h, "kind": self.kinds[i], "lambda": float(self.lambda_[i])}
                if self.max_abs_hidden is not None:
                    r["max_abs_hidden"] = float(self.max_abs_hidden[i])
                for k in self.keys:
                    r[k] = float(self._values[i, h, _STAT_KEYS.index(k)])
                out.append(r)
        return out

    def __repr__(self) -> str:
        return f"<diffscope.Stats {len(self.layers)} layers x {self.heads} heads: {', '.join(self.keys)}>"


class Session:
    """A model opened on a backend. Use diffscope.open(path, backend=...) or Session(path, backend=...).

    A session runs one sequence at a time (the prompt and what generate() appends). Results of earlier layers are
    reused: after set_lambda(l, ...) the next run() starts at layer l. Every call releases the GIL while the engine
    works; Ctrl-C stops a long run between layers (KeyboardInterrupt) and the session stays usable. Close it (or use
    it as a context manager) to free the model's memory at once.
    """

    def __init__(self, path: Union[str, os.PathLike], backend: str = "auto", threads: int = 0,
                 gpu_mem_limit: Union[int, str, None] = None, plan_tokens: int = 0):
        if not isinstance(backend, str):
            raise TypeError(f"backend must be a str such as 'cpu', 'cuda' or 'cuda:1', not {type(backend).__name__}")
        limit = 0
        if isinstance(gpu_mem_limit, str):
            limit = _native._parse_size(gpu_mem_limit, "gpu_mem_limit")
        elif gpu_mem_limit is not None:
            limit = _int(gpu_mem_limit, "gpu_mem_limit", 62)
        self._s = _native._Session(os.fspath(path), backend, _int(threads, "threads"), limit,
                                   _int(plan_tokens, "plan_tokens", 62))
        self.last_run_from: Optional[int] = None  # the first layer the last run() recomputed
        self._text: Optional[str] = None  # the last text prompt (token_range)

    # ------------------------------------------------------------------------------------------------ the model
    @property
    def config(self) -> dict:
        """The model's configuration: architecture, family, layers, heads, view_heads, layer_kinds, ..."""
        return self._s.config

    @property
    def model_dir(self) -> str:
        return self._s.model_dir

    @property
    def backend(self) -> str:
        """The backend as shown to people: 'CPU (OpenBLAS, 2 threads)', 'CUDA: NVIDIA H200'."""
        return self._s.backend_name

    @property
    def backend_kind(self) -> str:
        """'cpu' or 'cuda'."""
        return self._s.backend_kind

    @property
    def differential(self) -> bool:
        return bool(self._s.config["differential"])

    @property
    def layers(self) -> int:
        return int(self._s.config["layers"])

    @property
    def heads(self) -> int:
        """View heads per layer: differential heads (DiffLlama), query heads (Llama)."""
        return int(self._s.config["view_heads"])

    @property
    def layer_kinds(self) -> list:
        return list(self._s.config["layer_kinds"])

    @property
    def map_layers(self) -> list:
        """The layers with attention maps (all of them but a hybrid's Mamba and GMU layers)."""
        return list(self._s.config["map_layers"])

    # ------------------------------------------------------------------------------------------------ tokens
    def encode(self, text: str, add_special: bool = True) -> list:
        return self._s.encode(_str(text, "text"), _bool(add_special, "add_special"))

    def decode(self, ids: Sequence[int]) -> str:
        return self._s.decode(_ids(ids, "ids"))

    def token_text(self, id: int) -> str:
        return self._s.token_text(_int(id, "id"))

    # ------------------------------------------------------------------------------------------------ running
    def run(self, prompt: Optional[PromptLike] = None, *, all_logits: bool = False) -> "Session":
        """Runs a prompt (text, or token ids) -- or, with none, what is stale after a lambda change. Returns self.

        Text needs the model folder's tokenizer. all_logits keeps every position's logits (logits(True)).
        """
        if prompt is not None:
            if isinstance(prompt, str):
                self._s.set_prompt(prompt)
                self._text = prompt
            else:
                self._s.set_ids(_ids(prompt, "prompt"))
                self._text = None
        self.last_run_from = self._s.run(_bool(all_logits, "all_logits"))
        bad = self._s.nonfinite_logits()
        if bad:
            raise Error(bad)
        return self

    @property
    def stale_from(self) -> int:
        """The first layer run() would recompute (layers when nothing is stale)."""
        return self._s.stale_from

    @property
    def ids(self) -> np.ndarray:
        """The sequence's token ids (prompt and generated), int32."""
        return self._s.ids

    @property
    def n(self) -> int:
        return int(self._s.ids.shape[0])

    @property
    def tokens(self) -> list:
        """Every position as TokenInfo(id, text, begin, end, special); begin/end are byte offsets into the prompt."""
        return [TokenInfo(*t) for t in self._s.token_spans]

    def token_range(self, begin: int, end: int) -> tuple:
        """The token positions [first, last + 1) whose text overlaps characters [begin, end) of the last text prompt
        (what diffscope-scan does with a corpus line's "answer" span): e.g. the needle of a retrieval prompt."""
        if self._text is None:
            raise Error("token_range: the sequence did not come from a text prompt (run(text) first)")
        begin, end = _int(begin, "begin", 62), _int(end, "end", 62)
        if not 0 <= begin < end <= len(self._text):
            raise Error(f"token_range: [{begin}, {end}) is not a non-empty span of the prompt's {len(self._text)} "
                        "characters")
        b0, b1 = len(self._text[:begin].encode()), len(self._text[:end].encode())
        hit = [i for i, t in enumerate(self.tokens) if not t.special and t.begin < b1 and t.end > b0]
        if not hit:
            raise Error(f"token_range: no token covers characters [{begin}, {end})")
        return hit[0], hit[-1] + 1

    @property
    def prompt_length(self) -> int:
        return int(self._s.prompt_length)

    def top_k(self, k: int = 5) -> list:
        """The k most likely next tokens after the last position, as Token(id, prob, logit, text)."""
        return [Token(*t) for t in self._s.top_k(_int(k, "k"))]

    def logits(self, all_positions: bool = False) -> np.ndarray:
        """[vocab] logits of the last position, or [n, vocab] of every position (runs again if needed)."""
        return self._s.logits(_bool(all_positions, "all_positions"))

    def logprobs(self, all_positions: bool = False) -> np.ndarray:
        """log softmax of logits(): [vocab] for the last position (the engine's), or [n, vocab]."""
        if not all_positions:
            return self._s.next_token_logprobs()
        x = self._s.logits(True).astype(np.float64)
        x -= x.max(axis=1, keepdims=True)
        x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
        return x.astype(np.float32)

    # ------------------------------------------------------------------------------------------------ lambda
    @property
    def lambdas(self) -> Lambdas:
        model, eff, over, scale = self._s.lambdas()
        return Lambdas(np.asarray(model), np.asarray(eff), list(over), float(scale))

    def set_lambda(self, layer: int, value: Optional[float]) -> None:
        """Overrides one attention layer's lambda (None: back to the model's times lambda_scale). run() re-runs
        from that layer."""
        self._s.set_lambda(_int(layer, "layer"), None if value is None else _float(value, "value"))

    @property
    def lambda_scale(self) -> float:
        """Multiplies every layer's model lambda (layers without an override)."""
        return float(self._s.lambdas()[3])

    @lambda_scale.setter
    def lambda_scale(self, x: float) -> None:
        self._s.set_lambda_scale(_float(x, "lambda_scale"))

    def reset_lambda(self) -> None:
        """Scale 1 and no override: the checkpoint's lambdas."""
        self._s.reset_lambda()

    # ------------------------------------------------------------------------------------------------ interventions
    def ablate(self, layer: int, head: int, mode: str = "head") -> None:
        """Ablates view head `head` of attention layer `layer` from the next run() on (which starts at that layer).
        mode "head": the head's output zeroed (after its sub-layer norm and 1 - lambda_init, before o_proj); "a1": A1
        dropped (the head keeps -lambda A2 V, then its norm); "a2": A2 dropped (lambda 0 for this head); "mean": the
        head's output replaced by its mean over the prompt's positions (decoding steps keep the prompt's mean). Modes
        on one head combine, each setting its own part ("head" the output's scale, as scale_head does; "a2" the
        head's lambda, as set_head_lambda does: a later call on the same part replaces it); restore_head() undoes
        them."""
        self._s.ablate(_int(layer, "layer"), _int(head, "head"), _str(mode, "mode"))

    def scale_head(self, layer: int, head: int, factor: Optional[float]) -> None:
        """Multiplies a head's output by `factor` (0: ablated; None: the intervention removed) from the next run()."""
        self._s.set_head_scale(_int(layer, "layer"), _int(head, "head"),
                               None if factor is None else _float(factor, "factor"))

    def set_head_lambda(self, layer: int, head: int, lambda_: Optional[float]) -> None:
        """lambda for one differential view head alone (None: the layer's again; 0 drops its A2)."""
        self._s.set_head_lambda(_int(layer, "layer"), _int(head, "head"),
                                None if lambda_ is None else _float(lambda_, "lambda_"))

    def restore_head(self, layer: int, head: int) -> None:
        """Removes every intervention on one head (its scale, dropped maps and own lambda)."""
        self._s.restore_head(_int(layer, "layer"), _int(head, "head"))

    def knockout(self, layers, queries: Optional[Sequence[int]] = None, keys: Optional[Sequence[int]] = None) -> None:
        """Attention knockout from the next run() on: in `layers` (a layer, a (first, last) pair, or "all"), query
        positions [q0, q1) do not see keys [k0, k1) in either map. Positions below 0 count from the end of the prompt
        (-1: its last token); an end of None (or 0 after a negative start) reaches to the end of the sequence,
        generated tokens included; e.g. knockout("all", (-1, None), (5, 9)), or diffscope-run's spec alone:
        knockout("all:-1:,5:9"). A query left with no key attends to nothing (the head's output there is 0)."""
        if isinstance(layers, str) and ":" in layers:
            if queries is not None or keys is not None:
                raise TypeError("knockout: a spec L:Q0:Q1,K0:K1 comes alone, without queries and keys")
            self._s.knockout_spec(layers)
            return
        if queries is None or keys is None:
            raise TypeError("knockout: give layers, queries and keys, or one spec L:Q0:Q1,K0:K1")
        if isinstance(layers, str):
            if layers != "all":
                raise Error(f"knockout: layers {layers!r}: give a layer, a (first, last) pair or 'all'")
            l0, l1 = 0, self.layers
        elif isinstance(layers, (tuple, list)):
            if len(layers) != 2:
                raise Error("knockout: layers is a layer, a (first, last) pair or 'all'")
            l0, l1 = _int(layers[0], "layers"), _int(layers[1], "layers", 30) + 1
        else:
            l0 = _int(layers, "layers")
            l1 = l0 + 1
        q, k = _span(queries, "queries"), _span(keys, "keys")
        self._s.knockout(l0, l1, q[0], q[1], k[0], k[1])

    def head_importance(self, target: Optional[int] = None, modes: Optional[Sequence[str]] = None) -> dict:
        """Δ log p(target) at the last position when each view head of each attention layer is ablated, one at a
        time (each ablation re-runs only the layers from its own on), under the interventions already in force:
        {"target", "target_text", "base_logp", "layers", "heads", "complete", "done", "total" (ablations measured,
        to measure), "modes": {mode: [layers, heads] array}}, the keys of diffscope-run --importance.
        modes: of "a2", "a1", "head", "mean" (default: a2, a1 and head where the heads are differential, else head).
        target: a token id (default: the greedy next token). Ctrl-C stops it: what was measured comes back with
        complete=False (NaN where not measured) and a warning."""
        if modes is None:
            modes = self._s.importance_modes()
        elif isinstance(modes, str):
            modes = (modes,)
        elif not hasattr(modes, "__iter__"):
            raise TypeError(f"modes must be a mode or a list of modes (str), not {type(modes).__name__}")
        r = self._s.head_importance(-1 if target is None else _token(target, "target"),
                                    [_str(m, "modes") for m in modes])
        if not r["complete"]:
            import warnings
            warnings.warn(f"head importance interrupted after {r['done']} ablations (complete=False)", stacklevel=2)
        return r

    @property
    def interventions(self) -> list:
        """The interventions in force (as diffscope-run --json records them): {"kind": "ablate", "mode": "head" |
        "mean" | "a1" | "a2", "layer", "head"} ("a2": the head's lambda 0, however set), {"kind": "scale", "layer",
        "head", "factor"} (factor not 0), {"kind": "head_lambda", "layer", "head", "lambda"}, {"kind": "knockout",
        "spec", "layers", "queries", "keys"} (an end of None: to the end)."""
        return json.loads(self._s.interventions_json())

    def clear_interventions(self) -> None:
        """Removes every intervention (the next run() starts at the first layer that had one)."""
        self._s.clear_interventions()

    # ------------------------------------------------------------------------------------------------ residual stream
    def lens(self, positions: Optional[Sequence[int]] = None, layers: Optional[Sequence[int]] = None, top_k: int = 5,
             target: Optional[int] = None) -> dict:
        """The logit lens: each layer's output on the residual stream through the final norm and the LM head, at
        `positions` (default [-1], the last; below 0 counts from the end) of `layers` (default all):
        {"target", "target_text", "layers": [{"layer", "positions": [{"position", "top": [{"id", "text", "prob"}],
        "target_prob", "target_rank"}]}]}, as diffscope-run --lens writes it. The last layer's is the model's logits.
        target: a token id (default: the greedy next token)."""
        if isinstance(positions, (int, np.integer)):
            positions = [int(positions)]
        pos = [-1] if positions is None else _ids(positions, "positions", 64)
        if not pos:
            raise Error("lens: positions is empty (None: the last position)")
        lay = [] if layers is None else _ids(layers, "layers", 32)
        if layers is not None and not lay:
            raise Error("lens: layers is empty (None: every layer)")
        return json.loads(self._s.lens(pos, lay, _int(top_k, "top_k"), -1 if target is None else _token(target, "target")))

    @property
    def logit_bits(self) -> int:
        """The quantisation what-if in force: attention logits fake-quantised to this many bits (0: full precision)."""
        return int(self._s.logit_bits)

    def set_logit_bits(self, bits: Optional[int]) -> None:
        """Every attention logit fake-quantised to `bits` bits (2..16; None or 0: full precision) before the softmax,
        symmetric absmax per query row and head (the paper's Figure 8), from the next run() on, in the forward and the
        maps, and in generation's decoding steps."""
        self._s.set_logit_bits(0 if bits is None else _int(bits, "bits"))

    def quantize_report(self, bits: int) -> dict:
        """What quantising the logits to `bits` bits does to the current sequence, at its last position (generated
        tokens included): {"bits", "position", "kl" (of the next token's distribution from full precision's),
        "max_diff_change" (largest change of A1 - lambda A2, each head's lambda, over that position's rows),
        "top_full", "top_quantised"}; the session's own setting is kept (diffscope-run --quantize-logits)."""
        return json.loads(self._s.quantize_report(_int(bits, "bits")))

    def outliers(self, logits: bool = True) -> dict:
        """Activation outliers as in the paper's Table 5 (the largest values exact, the logits' medians within 2^-17
        relatively): per layer, the 1st, 2nd, 3rd, 10th and 100th largest |value| and the median over every
        position and channel of the layer's output ("hidden_top",
        "hidden_median") and over every causal |q.k / sqrt(d)| of the view heads' map 1 and map 2 ("logit_top1",
        "logit_median1", "logit_top2", "logit_median2"; logits=False skips them), and the same over all layers
        ("model"), as diffscope-run --outliers writes them. The logits are recomputed layer by layer: Ctrl-C
        stops them between layers (KeyboardInterrupt; the session is as it was)."""
        return json.loads(self._s.outliers(_bool(logits, "logits")))

    # ------------------------------------------------------------------------------------------------ maps
    def maps(self, layer: int, *, device: bool = False, max_bytes: float = 1e9) -> Maps:
        """A layer's full maps: .a1, .a2 [heads, n, n] (post-softmax) and .diff = a1 - head_lambda * a2 (.head_lambda
        [heads]: the layer's lambda .lambda_ unless the head has its own).

        O(n^2): refused above max_bytes (raise it, or ask view() / rows()). device=True: CUDA arrays (DLPack).
        """
        return self._s.maps(_int(layer, "layer"), _bool(device, "device"), _float(max_bytes, "max_bytes"))

    def view(self, layer: int, head: int, grid: Sequence[int] = (256, 256), rect: Optional[Sequence[int]] = None,
             pool: str = "max", lambda_: Optional[float] = None, *, device: bool = False) -> View:
        """A pooled view of one head: .a1, .a2, .diff [rows, cols] over the rectangle rect = (q0, q1, k0, k1) of
        query rows x key columns (default: the whole map; -1 or None ends: up to n), pooled to grid = (rows, cols)
        blocks by "max" (D keeps its largest-magnitude entry) or "mean". A small rectangle comes back exact.
        lambda_: the lambda of diff (default: the layer's in the run; no new forward needed).
        device=True: CUDA arrays (DLPack: torch.from_dlpack, cupy.from_dlpack) with no copy to the host.
        """
        rows, cols = _grid(grid)
        q0, q1, k0, k1 = _rect(rect)
        return self._s.view(_int(layer, "layer"), _int(head, "head"), rows, cols, q0, q1, k0, k1, _str(pool, "pool"),
                            None if lambda_ is None else _float(lambda_, "lambda_"), _bool(device, "device"), False)

    def mamba_view(self, layer: int, channel: int, grid: Sequence[int] = (256, 256),
                   rect: Optional[Sequence[int]] = None, pool: str = "max", *, device: bool = False) -> View:
        """The implicit attention of one channel of a Mamba layer's scan (hybrid models), pooled as view() pools
        (signed, unnormalised: .a1 = .diff, .a2 None)."""
        rows, cols = _grid(grid)
        q0, q1, k0, k1 = _rect(rect)
        return self._s.view(_int(layer, "layer"), _int(channel, "channel"), rows, cols, q0, q1, k0, k1,
                            _str(pool, "pool"), None, _bool(device, "device"), True)

    def mamba_row(self, layer: int, channel: int, position: int = -1) -> np.ndarray:
        """Row `position` of a Mamba channel's implicit attention, exact: [position + 1] keys."""
        return self._s.mamba_row(_int(layer, "layer"), _int(channel, "channel"), _int(position, "position", 62))

    def rows(self, positions: Union[int, Sequence[int]], layers: Optional[Sequence[int]] = None, *,
             device: bool = False) -> Rows:
        """Exact attention rows of query positions (negative: from the end, -1 = last) for every head:
        .a1, .a2 [layers, heads, len(positions), n] (a2 None for a plain model), .diff = a1 - head_lambda * a2 with
        .head_lambda [layers, heads] (each head's lambda: the layer's, .lambda_ [layers], unless the head has its
        own); layers default to every layer with maps."""
        if isinstance(positions, (int, np.integer)):
            positions = [int(positions)]
        return self._s.rows(_ids(positions, "positions", 64), None if layers is None else _ids(layers, "layers", 64),
                            _bool(device, "device"))

    def stats(self, layers: Optional[Sequence[int]] = None, lambda_: Optional[float] = None) -> Stats:
        """Per layer and head: entropies, first-token mass, negative mass, extremes of D, max |logit| (the keys of
        diffscope-run --stats). lambda_: the lambda of D (default: each layer's in the run)."""
        ls, values = self._s.head_stats(None if layers is None else _ids(layers, "layers", 64),
                                        None if lambda_ is None else _float(lambda_, "lambda_"))
        lam = self.lambdas
        kinds = self.layer_kinds
        if lambda_ is not None and self.differential:
            lam_arr = np.full(len(ls), float(np.float32(lambda_)))
        else:
            lam_arr = np.array([lam.effective[l] if self.differential else 0.0 for l in ls])
        mah = None
        if self._s.watching_max_abs_hidden:
            mah = self._s.max_abs_hidden()[np.asarray(ls, dtype=np.int64)]
        return Stats(ls, values, self.differential, lam_arr, [kinds[l] for l in ls], mah)

    def row_mass(self, layer: int, position: int, span: Sequence[int]) -> dict:
        """Row `position` of every head split into the key span [a0, a1), the sink (key 0) and the rest, for A1, A2,
        D and |D| (engine/core/map_query.h RowMass): {"answer": [heads, 4], "sink": ..., "context": ...}, the 4 maps
        in the order a1, a2, diff, abs_diff."""
        a0, a1 = (_int(x, "span", 62) for x in span)
        m = self._s.row_mass(_int(layer, "layer"), _int(position, "position", 62), a0, a1)
        return {"answer": m[:, :, 0], "sink": m[:, :, 1], "context": m[:, :, 2]}

    # ------------------------------------------------------------------------------------------------ generation
    def generate(self, max_new: int = 64, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int = 0, stop_at_eos: bool = True) -> Iterator[Token]:
        """Generates after the prompt (dropping an earlier continuation), one Token (prob and logit NaN) per step,
        with the KV cache, under the lambdas in force. Stop by leaving the loop (or Ctrl-C between tokens): what was
        generated stays, in ids, maps and statistics. Greedy by default; the same seed gives the same sample."""
        seed = _int(seed, "seed", 62)
        if seed < 0:
            raise Error(f"seed: {seed} must be >= 0")
        self._s.begin_generation(_int(max_new, "max_new"), _float(temperature, "temperature"), _int(top_k, "top_k"),
                                 _float(top_p, "top_p"), seed, _bool(stop_at_eos, "stop_at_eos"))
        return self._generation()

    def _generation(self) -> Iterator[Token]:
        try:
            while True:
                i = self._s.generate_step()
                if i < 0:
                    return
                yield Token(i, math.nan, math.nan, self._s.token_text(i))
        finally:
            if not self._s.closed and self._s.generating:
                self._s.stop_generation()

    @property
    def generated(self) -> list:
        """The ids generated after the prompt."""
        return self._s.generated()

    @property
    def generated_text(self) -> str:
        return self._s.generated_text()

    @property
    def stop_reason(self) -> str:
        """'', 'eos', 'max_tokens', 'context_full' or 'stopped'."""
        return self._s.stop_reason

    def clear_generation(self) -> None:
        """Back to the prompt alone."""
        self._s.clear_generation()

    # ------------------------------------------------------------------------------------------------ profiler
    def profile(self) -> dict:
        """The last forward's timings: forward_ms, tokens, peak_tflops, kernels (name, count, total/min/max ms),
        per attention head head_layer, head_head, head_ms, head_flops (arrays), and under a layer split a lane per
        device (device, first_layer, end_layer, start_ms, end_ms, handoff_ms, kernels_ms; empty on one device)."""
        return self._s.profile()

    def watch_max_abs_hidden(self, on: bool = True) -> None:
        """Turns on the paper's Table 5 reader (the largest |hidden state| of each layer's output over the
        sequence); the next run() starts at layer 0."""
        self._s.set_watch_max_abs_hidden(_bool(on, "on"))

    def max_abs_hidden(self) -> np.ndarray:
        """[layers] from the reader (watch_max_abs_hidden), over the prompt and every generated position."""
        return self._s.max_abs_hidden()

    # ------------------------------------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Frees the model (arrays already returned stay valid). Every later call raises diffscope.Error."""
        self._s.close()

    @property
    def closed(self) -> bool:
        return self._s.closed

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._s.closed:
            return "<diffscope.Session (closed)>"
        c = self._s.config
        return (f"<diffscope.Session {c['architecture']} {self._s.model_dir!r}: {c['layers']} layers x "
                f"{c['view_heads']} heads on {self._s.backend_name}, {self.n} tokens>")


def open(path: Union[str, os.PathLike], backend: str = "auto", threads: int = 0,  # noqa: A001
         gpu_mem_limit: Union[int, str, None] = None, plan_tokens: int = 0) -> Session:
    """Opens a Hugging Face model folder (config.json, *.safetensors, tokenizer) on a backend: "auto" (CUDA when a
    GPU is usable), "cpu", "cuda" or "cuda:N". threads: CPU threads (0: every core). A list ("cuda:0,1", "cuda:all")
    puts the model on as few of those GPUs as hold it, its layers in contiguous blocks; gpu_mem_limit (bytes, or
    "20G") caps what each may hold, which forces a split a large card would not need and refuses prompts such a card
    could not hold; plan_tokens: the prompt length (with what will be generated) the placement plans for (0: 4096)."""
    return Session(path, backend, threads, gpu_mem_limit, plan_tokens)


# ---------------------------------------------------------------------------------------------------- arguments
# Python types are checked here, with the argument's name, before anything reaches the engine.

def _int(x, name: str, bits: int = 31) -> int:
    """x as an int of the engine's: within +-2^bits (31: a C++ int; 62: positions, sizes, seeds)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an int, not {type(x).__name__}")
    x = int(x)
    if not -(1 << bits) <= x < (1 << bits):
        raise Error(f"{name}: {x} is out of range")
    return x


def _bool(x, name: str) -> bool:
    if not isinstance(x, (bool, np.bool_)) and not (isinstance(x, (int, np.integer)) and x in (0, 1)):
        raise TypeError(f"{name} must be a bool, not {type(x).__name__}")
    return bool(x)


def _float(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, not {type(x).__name__}")
    x = float(x)
    if not math.isfinite(x):
        raise Error(f"{name}: {x} is not a finite number")
    return x


def _token(x, name: str) -> int:
    x = _int(x, name)
    if x < 0:
        raise Error(f"{name}: {x} is not a token id (ids are >= 0; None: the greedy next token)")
    return x


def _str(x, name: str) -> str:
    if not isinstance(x, str):
        raise TypeError(f"{name} must be a str, not {type(x).__name__}")
    return x


def _span(x, name: str) -> tuple:
    """A (start, end) pair; an end of None: to the end (the engine's 0 after a negative start, else its largest)."""
    if isinstance(x, (str, bytes)) or not hasattr(x, "__len__") or len(x) != 2:
        raise TypeError(f"{name} must be a (start, end) pair of ints")
    start = _int(x[0], name, 62)
    if x[1] is None:
        return start, 0 if start < 0 else (1 << 63) - 1
    return start, _int(x[1], name, 62)


def _ids(x, name: str, bits: int = 32) -> list:
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of ints, not {type(x).__name__}")
    if isinstance(x, np.ndarray):
        if x.ndim != 1 or not np.issubdtype(x.dtype, np.integer):
            raise TypeError(f"{name} must be a 1-D integer array, not {x.ndim}-D {x.dtype}")
        x = x.tolist()
    try:
        out = [_int(v, name, 62) for v in x]
    except TypeError as e:
        if "not iterable" in str(e):
            raise TypeError(f"{name} must be a sequence of ints, not {type(x).__name__}") from None
        raise
    lim = 1 << (bits - 1)
    for v in out:
        if not -lim <= v < lim:
            raise Error(f"{name}: {v} is out of range")
    return out


def _grid(grid) -> tuple:
    if isinstance(grid, (int, np.integer)) and not isinstance(grid, bool):
        grid = (grid, grid)
    g = _ids(grid, "grid")
    if len(g) != 2:
        raise Error(f"grid: expected (rows, cols), got {len(g)} values")
    return g[0], g[1]


def _rect(rect) -> tuple:
    if rect is None:
        return 0, -1, 0, -1
    if isinstance(rect, (str, bytes)) or len(rect) != 4:
        raise Error("rect: expected (q0, q1, k0, k1)")
    out = []
    for i, v in enumerate(rect):
        if v is None:
            out.append(-1 if i % 2 else 0)
        else:
            v = _int(v, "rect", 62)
            if v < 0 and i % 2 == 0:
                raise Error(f"rect: start {v} is negative")
            out.append(v)
    return tuple(out)
