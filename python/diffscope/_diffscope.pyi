"""diffscope's engine (native part). Use the package: import diffscope."""

import numpy
from numpy.typing import NDArray


class Error(Exception):
    """
    An error a caller can cause (a file, a prompt, an argument): one line naming it and the problem.
    """

def cuda_available() -> bool:
    """
    True when this build has the CUDA backend and a usable NVIDIA GPU (compute capability 8.0+) is present.
    """

def cuda_device_count() -> int:
    """Usable NVIDIA GPUs (0 without the CUDA backend or a driver)."""

def cuda_built() -> bool:
    """
    True when this build of the module has the CUDA backend (a GPU may still be missing: cuda_available()).
    """

class View:
    """
    A pooled view of one head's maps (Session.view) or of a Mamba channel (mamba_view).
    """

    @property
    def a1(self) -> object:
        """
        [rows, cols] map 1 (the only map of a plain head; a Mamba channel's implicit map)
        """

    @property
    def a2(self) -> object:
        """[rows, cols] map 2, or None for a plain (single-softmax) head"""

    @property
    def diff(self) -> object:
        """[rows, cols] A1 - lambda * A2 (equal to a1 for a plain head)"""

    @property
    def layer(self) -> int: ...

    @property
    def head(self) -> int:
        """the view head (a channel for mamba_view)"""

    @property
    def rect(self) -> tuple[int, int, int, int]:
        """(q0, q1, k0, k1) after clamping to the sequence"""

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, cols) after capping at the rectangle's extent"""

    @property
    def pool(self) -> str: ...

    @property
    def differential(self) -> bool: ...

    @property
    def on_device(self) -> bool: ...

    def __repr__(self) -> str: ...

class Rows:
    """
    Exact attention rows of chosen query positions, every head of the chosen layers.
    """

    @property
    def a1(self) -> object:
        """[layers, heads, positions, n] map 1"""

    @property
    def a2(self) -> object:
        """[layers, heads, positions, n] map 2, or None for a plain model"""

    @property
    def diff(self) -> object:
        """
        [layers, heads, positions, n] A1 - head_lambda * A2 per head (a new array; a1 itself for a plain model)
        """

    @property
    def head_lambda(self) -> NDArray[numpy.float32]:
        """
        [layers, heads] the lambda of each head's diff: the layer's, or the head's own (set_head_lambda; 0 with A2 dropped); 0 for plain models
        """

    @property
    def layers(self) -> list[int]: ...

    @property
    def positions(self) -> list[int]:
        """resolved (negative ones counted from the end)"""

    @property
    def differential(self) -> bool: ...

    @property
    def on_device(self) -> bool: ...

class Maps:
    """A layer's full maps [heads, n, n] (O(n^2): small prompts)."""

    @property
    def a1(self) -> object:
        """[heads, n, n] map 1"""

    @property
    def a2(self) -> object:
        """[heads, n, n] map 2, or None for a plain model"""

    @property
    def diff(self) -> object:
        """
        [heads, n, n] A1 - head_lambda * A2 per head (a new array; a1 itself for a plain model)
        """

    @property
    def layer(self) -> int: ...

    @property
    def head_lambda(self) -> NDArray[numpy.float32]:
        """
        [heads] the lambda of each head's diff: the layer's, or the head's own (set_head_lambda; 0 with A2 dropped); 0 for plain models
        """

    @property
    def differential(self) -> bool: ...

    @property
    def on_device(self) -> bool: ...
