"""Ops with one plain-torch form and optional forms for a platform, one chosen when the op is
built (vLLM's `CustomOp`): a generic layer never asks per call which machine it runs on.

The form follows the device the op is built on: the loader builds a model under
`torch.device(device)`, so a layer built for the CPU calls `forward_cpu` from its first step
on. A form that a platform does not override is the native one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# the form each device type runs; any other device runs `forward_native`
_FORMS = {"cpu": "cpu", "cuda": "cuda"}


def op_form(device: torch.device) -> str:
    """ "cpu", "cuda" or "native": which `forward_*` an op built on `device` runs."""
    return _FORMS.get(device.type, "native")


class CustomOp(nn.Module):
    """Subclasses implement `forward_native` and may override `forward_cpu` / `forward_cuda`.
    `form` overrides the choice made from the default device (tests compare forms)."""

    def __init__(self, form: str | None = None) -> None:
        super().__init__()
        form = form or op_form(torch.get_default_device())
        self._impl = getattr(self, f"forward_{form}")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._impl(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def forward_cpu(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)

    def forward_cuda(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_native(*args, **kwargs)
