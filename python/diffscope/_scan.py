"""Corpus scans: diffscope-scan's analysis (engine/session/session_scan.h) over prompts given as a JSONL file or as
Python dicts, returning the same report."""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Union

from . import _diffscope as _native
from ._diffscope import Error
from ._session import Session, _bool, _float, _int, _str


@dataclass
class RunReport:
    """One model (at one lambda scale) over the prompts: the keys of diffscope-scan's report."""
    label: str
    model: str
    architecture: str
    differential: bool
    backend: str
    lambda_scale: float
    prompts: int
    logit_bits: int
    tokens: int
    accuracy: Optional[float]
    with_target: int
    correct: int
    mean: dict
    layers: list
    groups: dict = field(default_factory=dict)
    per_prompt: list = field(default_factory=list)
    outliers: Optional[dict] = None  # scan(outliers=True): diffscope-scan --outliers's "outliers"
    interventions: list = field(default_factory=list)  # the session's interventions in force (Session.interventions)

    @classmethod
    def _from(cls, d: dict) -> "RunReport":
        args = {k: d.get(k) for k in cls.__dataclass_fields__}
        args["groups"] = d.get("groups", {})
        args["per_prompt"] = d.get("per_prompt", [])
        args["outliers"] = d.get("outliers")
        args["interventions"] = d.get("interventions", [])
        return cls(**args)

    def to_records(self) -> list:
        """One dict per (layer, head) with the fraction keys (diffscope-scan --csv's rows), for pandas."""
        out = []
        for layer in self.layers:
            for h in layer["heads"]:
                r = {"label": self.label, "layer": layer["layer"], "kind": layer["kind"]}
                r.update(h)
                out.append(r)
        return out


@dataclass
class Report:
    """What diffscope-scan writes: report.to_dict() is its JSON, key for key."""
    input: str
    complete: bool
    elapsed_s: float
    skipped: list
    run: RunReport
    compare: Optional[RunReport]
    _dict: dict = field(repr=False, default_factory=dict)

    def to_dict(self) -> dict:
        return self._dict

    def to_records(self) -> list:
        return self.run.to_records() + (self.compare.to_records() if self.compare else [])


def _report(text: str) -> Report:
    d = json.loads(text)
    run_keys = {k: v for k, v in d.items() if k not in ("tool", "input", "complete", "skipped", "elapsed_s", "compare")}
    return Report(d["input"], d["complete"], d["elapsed_s"], d["skipped"], RunReport._from(run_keys),
                  RunReport._from(d["compare"]) if "compare" in d else None, d)


def scan(model: Union[str, os.PathLike, Session], prompts: Union[str, os.PathLike, Iterable], *,
         compare: Union[str, os.PathLike, Session, None] = None, lambda_scale: Optional[float] = None,
         compare_lambda_scale: Optional[float] = None, label: str = "", compare_label: str = "",
         max_answer_tokens: int = 32, max_prompts: Optional[int] = None, backend: str = "auto", threads: int = 0,
         outliers: bool = False, logit_bits: Optional[int] = None,
         progress: Optional[Callable[[int, int], None]] = None) -> Report:
    """Scans prompts through a model as diffscope-scan does: per attention layer and head, how the last prompt
    token's attention row splits between the answer span, the sink and the rest, for A1, A2 and A1 - lambda*A2, and
    the greedy answer's accuracy where prompts have a target.

    model / compare: a model folder (opened on `backend`) or an open Session. prompts: a JSONL file (read as
    diffscope-scan reads it) or an iterable of dicts ({"text" or "ids", "answer": [b, e), "target", tags...}) or
    JSON lines. compare_lambda_scale alone compares the model with itself at another scale. A bad prompt is skipped
    and listed in report.skipped. Ctrl-C stops between prompts: the report of what was scanned comes back with
    complete=False (and a warning). progress(done, total) is called after each prompt. outliers=True adds each run's
    activation outliers over the prompts (report.run.outliers; Session.outliers's keys). logit_bits: the attention
    logits fake-quantised to that many bits in every run (Session.set_logit_bits; accuracy under quantisation; 0:
    full precision). lambda_scale and logit_bits left None take a Session's own (1 and 0 for a folder); a Session's
    interventions apply too and the report lists them; afterwards it has its settings back and the last prompt's
    tokens.
    backend may be a list, one replica of the model each ("cuda:all", "cuda:0,1", "cpu,cpu"): the prompts go to
    whichever replica is free and the report is the one a single backend gives (model and compare then are folders).
    """
    backend = _str(backend, "backend")
    if logit_bits is None:
        logit_bits = model.logit_bits if isinstance(model, Session) else 0
    logit_bits = _int(logit_bits, "logit_bits")
    if logit_bits != 0 and not 2 <= logit_bits <= 16:
        raise Error(f"logit_bits: {logit_bits} bits is outside 2..16 (0: full precision)")
    if lambda_scale is None:
        lambda_scale = model.lambda_scale if isinstance(model, Session) else 1.0
    if "," in backend or backend == "cuda:all":
        return _replica_scan(model, prompts, compare, backend, threads, label, lambda_scale, compare_lambda_scale,
                             compare_label, max_answer_tokens, max_prompts, outliers, logit_bits, progress)
    a = model if isinstance(model, Session) else Session(model, backend, threads)
    b = compare if isinstance(compare, Session) or compare is None else Session(compare, backend, threads)
    sc = _native._Scan(a._s, None if b is None else b._s, _str(label, "label"), _float(lambda_scale, "lambda_scale"),
                       None if compare_lambda_scale is None else _float(compare_lambda_scale, "compare_lambda_scale"),
                       _str(compare_label, "compare_label"), _int(max_answer_tokens, "max_answer_tokens"),
                       _bool(outliers, "outliers"), _int(logit_bits, "logit_bits"))
    if max_prompts is not None and _int(max_prompts, "max_prompts") < 1:
        raise Error(f"max_prompts: {max_prompts} must be at least 1")
    if isinstance(prompts, (str, os.PathLike)):
        source = os.fspath(prompts)
        available = sc.load(source)
        total = available if max_prompts is None else min(available, max_prompts)
        step = sc.run_loaded
    else:
        source = "<python>"
        lines = _prompt_lines(prompts)
        available = len(lines)
        total = available if max_prompts is None else min(available, max_prompts)
        def step(i):
            return sc.add(lines[i], i + 1)
    complete = True
    done = 0
    try:
        for i in range(total):
            step(i)
            done += 1
            if progress is not None:
                progress(done, total)
    except KeyboardInterrupt:
        complete = False
        warnings.warn(f"scan interrupted after {sc.scanned} prompts: the report holds those (complete=False)",
                      stacklevel=2)
    finally:
        # A Session's sequence is now the scan's last prompt (its lambda scale and logit bits are its own again):
        # its last text prompt no longer names the tokens (token_range)
        for s in (a, b):
            if s is not None:
                s._text = None
    if complete and sc.scanned == 0:
        raise Error(f"{source}: no prompt could be scanned ({done} tried; the first reason: "
                    f"{_first_reason(sc, source)})")
    # complete as diffscope-scan says it: every prompt of the input tried, and at least one scanned
    return _report(sc.report_json(source, complete and total == available and sc.scanned > 0))


def _prompt_lines(prompts: Iterable) -> list:
    """Prompts given as dicts or JSON lines, as JSON lines (a bad type is a TypeError naming its index)."""
    lines = []
    for i, p in enumerate(prompts):
        if isinstance(p, dict):
            lines.append(json.dumps(p))
        elif isinstance(p, str):
            lines.append(p)
        else:
            raise TypeError(f"prompts[{i}] must be a dict or a JSON line, not {type(p).__name__}")
    if not lines:
        raise Error("scan: no prompts given")
    return lines


def _replica_scan(model, prompts, compare, backend, threads, label, lambda_scale, compare_lambda_scale, compare_label,
                  max_answer_tokens, max_prompts, outliers, logit_bits, progress) -> Report:
    if isinstance(model, Session) or isinstance(compare, Session):
        raise Error(f"backend {backend!r}: a scan on several backends opens the models itself: give model folders, "
                    "not Sessions")
    if max_prompts is not None and _int(max_prompts, "max_prompts") < 1:
        raise Error(f"max_prompts: {max_prompts} must be at least 1")
    if isinstance(prompts, (str, os.PathLike)):
        source, lines = os.fspath(prompts), []
    else:
        source, lines = "<python>", _prompt_lines(prompts)
    text, interrupted, scanned = _native._replica_scan(
        os.fspath(model), "" if compare is None else os.fspath(compare), backend, _int(threads, "threads"),
        _str(label, "label"), _float(lambda_scale, "lambda_scale"),
        None if compare_lambda_scale is None else _float(compare_lambda_scale, "compare_lambda_scale"),
        _str(compare_label, "compare_label"), _int(max_answer_tokens, "max_answer_tokens"), _bool(outliers, "outliers"),
        _int(logit_bits, "logit_bits"), source, lines, max_prompts, progress)
    if interrupted:
        warnings.warn(f"scan interrupted after {scanned} prompts: the report holds those (complete=False)", stacklevel=3)
    elif scanned == 0:
        d = json.loads(text)
        raise Error(f"{source}: no prompt could be scanned (the first reason: "
                    f"{d['skipped'][0]['error'] if d['skipped'] else 'none given'})")
    return _report(text)


def _first_reason(sc, source: str) -> str:
    d = json.loads(sc.report_json(source, False))
    return d["skipped"][0]["error"] if d["skipped"] else "none given"
