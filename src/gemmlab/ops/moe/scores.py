"""Top-k routing scores, in torch ops (no kernel): what ``route`` and ``torch.ops.gemmlab.route`` compute.

Legend: T tokens, E experts, k top-k.

    route_scores(logits (T, E), k, renormalize, scoring) -> weights (T, k) fp32, ids (T, k) int32
"""

from __future__ import annotations

import torch


def route_scores(router_logits: torch.Tensor, top_k: int, renormalize: bool, scoring: str):
    """``route`` on checked arguments: softmax (over E) or sigmoid scores in fp32, the top k, renormalized to
    sum 1 per token when ``renormalize``."""
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring == "softmax" else torch.sigmoid(logits)
    weights, ids = torch.topk(scores, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)
