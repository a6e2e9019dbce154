"""diffscope: differential attention (Ye et al. 2024) in a notebook.

Open a checkpoint, run a prompt, and read the two softmax maps A1 and A2 of every layer and head and their
difference A1 - lambda * A2, move lambda and see the prediction change, scan a corpus -- the engine of the diffscope
GUI and CLIs, with results as NumPy arrays over the engine's own buffers (and, on the CUDA backend, device arrays
that torch.from_dlpack and CuPy take without a copy).

    import diffscope
    s = diffscope.open("assets/models/diffllama-demo")          # backend="auto" | "cpu" | "cuda" | "cuda:N"
    s.run("The capital of France is")
    s.top_k(5)                                                 # [Token(id, prob, logit, text), ...]
    v = s.view(3, 0, grid=(256, 256))                           # v.a1, v.a2, v.diff: [256, 256] float32
    s.set_lambda(3, 0.0); s.run(); s.logprobs()                 # a re-run from layer 3 only

Errors a caller can cause raise diffscope.Error with a one-line message; Ctrl-C stops a long run or scan and leaves
the session usable.
"""
from __future__ import annotations

from ._diffscope import Error, Maps, Rows, View, cuda_available, cuda_built, cuda_device_count
from ._session import Lambdas, Session, Stats, Token, TokenInfo, open
from ._scan import Report, RunReport, scan

__version__ = "0.1.0"

__all__ = [
    "Error", "Lambdas", "Maps", "Report", "Rows", "RunReport", "Session", "Stats", "Token", "TokenInfo", "View",
    "cuda_available", "cuda_built", "cuda_device_count", "open", "scan", "__version__",
]
