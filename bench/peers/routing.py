"""Routing in plain torch (DESIGN §3), as a peer written with torch ops would do it.

Every method: f32 scores from the logits (bf16 converts exactly), a selection, weights from
the unbiased scores, × routed_scaling_factor (moekit applies the factor to every method).
Selection ranks a NaN below every number and breaks ties towards the lower expert index
(a stable descending sort, not torch.topk, whose order among equals is unspecified).
"""
import torch

NEG_INF = float("-inf")


def _select(keys, k):
    """Indices [T, k] of the k best keys per row; NaN ranks with -inf, ties to the lower index."""
    keys = torch.where(torch.isnan(keys), torch.full_like(keys, NEG_INF), keys)
    return torch.sort(keys, dim=-1, descending=True, stable=True).indices[:, :k]


def _renormalize(w):
    total = w.sum(dim=-1, keepdim=True)
    return w / torch.where(total == 0, torch.ones_like(total), total)


def _softmax(x):
    """Softmax that leaves NaN logits out of the max and the sum."""
    return torch.softmax(torch.where(torch.isnan(x), torch.full_like(x, NEG_INF), x), dim=-1)


def _keep_best_groups(choice, n_group, topk_group):
    """DeepSeek-V3's group limit: a group scores the sum of its two best choices (its only one
    when it has one expert); experts outside the topk_group best groups become -inf."""
    t, e = choice.shape
    size = e // n_group
    grouped = choice.view(t, n_group, size)
    group_score = grouped.topk(min(2, size), dim=-1).values.sum(dim=-1)  # [T, n_group]
    kept = _select(group_score, topk_group)                                  # [T, topk_group]
    keep = torch.zeros(t, n_group, dtype=torch.bool, device=choice.device).scatter_(1, kept, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), NEG_INF).view(t, e)


def route(config, router_logits, bias=None):
    """topk_ids [T, k] int64 and topk_weights [T, k] f32 for one routing method."""
    x = router_logits.float()
    k, method = config.top_k, config.routing
    if method in ("softmax_topk", "softmax_topk_renorm"):
        s = _softmax(x)
        ids = _select(s, k)
        w = s.gather(1, ids)
        if method == "softmax_topk_renorm":
            w = _renormalize(w)
    elif method == "topk_softmax":
        ids = _select(x, k)
        w = torch.softmax(x.gather(1, ids), dim=-1)
    elif method in ("sigmoid_topk", "sigmoid_topk_renorm"):
        s = torch.sigmoid(x)
        ids = _select(s, k)
        w = s.gather(1, ids)
        if method == "sigmoid_topk_renorm":
            w = _renormalize(w)
    elif method in ("sigmoid_bias_grouped", "sigmoid_bias_renorm"):
        if bias is None:
            raise ValueError(f"routing {method}: needs e_score_correction_bias, absent from the layer file")
        s = torch.sigmoid(x)
        choice = s + bias.float()
        if method == "sigmoid_bias_grouped":
            choice = _keep_best_groups(choice, config.n_group, config.topk_group)
        ids = _select(choice, k)
        w = _renormalize(s.gather(1, ids))  # the bias chooses, it never weighs
    elif method == "top1_sigmoid":
        ids = _select(x, 1)
        w = torch.sigmoid(x.gather(1, ids))
    else:
        raise ValueError(f"routing: '{method}' is not computed here (external routing comes with the layer file)")
    return ids, w * config.routed_scaling_factor


def routing_of(config, inputs):
    """(topk_ids int64 [T, k], topk_weights f32 [T, k]) for an Inputs: computed from its logits,
    or its external ids/weights, where an id of -1 (no expert) becomes expert 0 with weight 0."""
    if inputs.router_logits is not None and config.routing != "external":
        return route(config, inputs.router_logits, inputs.bias)
    ids = inputs.topk_ids.long()
    valid = ids >= 0
    return ids.clamp(min=0), inputs.topk_weights.float() * valid
