"""A seam for counting Triton launches: stands in for a @triton.jit kernel in its module,
records the grid and the constexpr keywords of each launch, then launches the real kernel."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class LaunchRecorder:
    kernel: object  # the real @triton.jit function
    grids: list[tuple[int, ...]] = field(default_factory=list)
    constexprs: list[dict[str, object]] = field(default_factory=list)

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., object]:
        def launch(*args: object, **kwargs: object) -> object:
            self.grids.append(tuple(grid))
            self.constexprs.append(dict(kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch

    def values_of(self, name: str) -> list[object]:
        """The value of keyword `name` at each recorded launch, in order."""
        return [launch[name] for launch in self.constexprs]
