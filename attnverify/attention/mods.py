"""Named score modifications (FlexAttention's ``score_mod`` / ``mask_mod``), in float64 for the
reference. Positions are top-left aligned like SDPA's ``is_causal``: query ``i``, key ``j``.

| id | effect | parameter |
| --- | --- | --- |
| ``causal`` | keys ``j ≤ i`` only | |
| ``sliding_window`` | keys ``i − window < j ≤ i`` only | ``window`` (default 8) |
| ``alibi`` | ``s + m_h·(j − i)``, ``m_h = 2^(−8(h+1)/H)`` (Press et al. 2022) | |
| ``softcap`` | ``cap·tanh(s / cap)`` (Gemma 2) | ``cap`` (default 20) |
"""

from __future__ import annotations

import torch

MODS = ("causal", "sliding_window", "alibi", "softcap")
#: Modifications that can leave a query with no key at all (the window past the last key).
EMPTIES_ROWS = ("sliding_window",)
DEFAULTS = {"causal": {}, "sliding_window": {"window": 8}, "alibi": {}, "softcap": {"cap": 20.0}}


def alibi_slopes(heads: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """``m_h = 2^(−8(h+1)/H)`` for h = 0 … H−1."""
    h = torch.arange(heads, dtype=dtype, device=device)
    return torch.exp2(-8.0 * (h + 1) / heads)


def apply(name: str, s: torch.Tensor, **params) -> torch.Tensor:
    """The modified scores ``[batch, heads, L_q, L_k]`` (masks are :func:`allowed`'s job)."""
    if name == "alibi":
        l_q, l_k = s.shape[-2], s.shape[-1]
        i = torch.arange(l_q, dtype=s.dtype, device=s.device)[:, None]
        j = torch.arange(l_k, dtype=s.dtype, device=s.device)[None, :]
        slopes = alibi_slopes(s.shape[-3], s.dtype, s.device)[:, None, None]
        return s + slopes * (j - i)
    if name == "softcap":
        cap = float(params.get("cap", DEFAULTS["softcap"]["cap"]))
        return cap * torch.tanh(s / cap)
    return s


def allowed(name: str, l_q: int, l_k: int, device="cpu", **params) -> torch.Tensor:
    """Boolean ``[L_q, L_k]``: the keys each query may attend under the modification."""
    i = torch.arange(l_q, device=device)[:, None]
    j = torch.arange(l_k, device=device)[None, :]
    if name == "causal":
        return j <= i
    if name == "sliding_window":
        window = int(params.get("window", DEFAULTS["sliding_window"]["window"]))
        return (j <= i) & (j > i - window)
    return torch.ones(l_q, l_k, dtype=torch.bool, device=device)
