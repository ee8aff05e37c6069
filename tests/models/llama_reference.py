"""The decoder's forward pass in float64 NumPy, written from the
architecture's definition (not from either framework's model): the
independent reference the PyTorch and JAX models are compared with."""

import numpy as np


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):
    """x [seq, heads, head_dim]: pairs (i, i + head_dim/2) rotated by pos * theta**(-2i/hd)."""
    hd = x.shape[-1]
    freq = theta ** (-np.arange(hd // 2) * 2.0 / hd)
    ang = pos[:, None, None] * freq[None, None, :]
    a, b = x[..., :hd // 2], x[..., hd // 2:]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang),
                           b * np.cos(ang) + a * np.sin(ang)], axis=-1)


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def logits(params, tokens, cfg, router_scores=None):
    """tokens [batch, seq] -> float64 logits [batch, seq, vocab].
    router_scores: None, or a list that gets, per MoE layer, the router
    scores [batch * seq, E] of every token."""
    p64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    out = []
    routed = [[] for _ in params["layers"]]  # each layer's router scores, per sequence
    for seq in tokens:
        s = len(seq)
        pos = np.arange(s, dtype=np.float64)
        x = p64(params["embed"])[seq]
        for i, lp in enumerate(params["layers"]):
            h = _rms_norm(x, p64(lp["attn_norm"]), cfg.norm_eps)
            q = (h @ p64(lp["wq"])).reshape(s, cfg.heads, cfg.head_dim)
            k = (h @ p64(lp["wk"])).reshape(s, cfg.num_kv_heads, cfg.head_dim)
            v = (h @ p64(lp["wv"])).reshape(s, cfg.num_kv_heads, cfg.head_dim)
            q, k = _rope(q, pos, cfg.rope_theta), _rope(k, pos, cfg.rope_theta)
            group = cfg.heads // cfg.num_kv_heads
            o = np.empty_like(q)
            causal = np.tril(np.ones((s, s), bool))
            for head in range(cfg.heads):
                kv = head // group
                scores = q[:, head] @ k[:, kv].T / np.sqrt(cfg.head_dim)
                o[:, head] = _softmax(np.where(causal, scores, -np.inf)) @ v[:, kv]
            x = x + o.reshape(s, cfg.hidden) @ p64(lp["wo"])
            h = _rms_norm(x, p64(lp["mlp_norm"]), cfg.norm_eps)
            if "router" in lp:
                routed[i].append(h @ p64(lp["router"]))
                x = x + _moe(h, lp, cfg)
            else:
                x = x + _swiglu(h, lp)
        out.append(_rms_norm(x, p64(params["final_norm"]), cfg.norm_eps) @ p64(params["lm_head"]))
    if router_scores is not None:
        router_scores += [np.concatenate(r) for r in routed if r]
    return np.stack(out)


def _swiglu(h, lp, expert=()):
    w = lambda n: np.asarray(lp[n], np.float64)[expert]  # noqa: E731
    gate, up = h @ w("w_gate"), h @ w("w_up")
    return (gate / (1 + np.exp(-gate)) * up) @ w("w_down")


def _moe(h, lp, cfg):
    """Each token through its top_k experts (by router score), weighted by
    the softmax of those top_k scores."""
    scores = h @ np.asarray(lp["router"], np.float64)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = np.argsort(-scores[t], kind="stable")[:cfg.top_k]
        weights = _softmax(scores[t, top])
        for e, w in zip(top, weights):
            out[t] += w * _swiglu(h[t], lp, (e,))
    return out


def load_balancing_loss(scores, top_k):
    """Switch Transformer's balancing loss E * sum_e f_e * P_e of router
    scores [tokens, E]: f_e the share of the tokens' top_k choices that go
    to expert e, P_e the mean softmax probability of e."""
    tokens, experts = scores.shape
    top = np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]
    f = np.bincount(top.reshape(-1), minlength=experts) / (tokens * top_k)
    p = _softmax(scores).mean(axis=0)
    return experts * np.sum(f * p)


def aux_loss(params, tokens, cfg):
    """The model's load-balancing loss: the sum over its MoE layers of each's
    load_balancing_loss over all the batch's tokens."""
    scores = []
    logits(params, tokens, cfg, scores)
    return sum(load_balancing_loss(s, cfg.top_k) for s in scores)


def cross_entropy(logits64, targets):
    z = logits64 - logits64.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.mean(np.take_along_axis(logp, targets[..., None], axis=-1))
