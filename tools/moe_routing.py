"""Routing of transformers' mixture-of-experts models: which experts each token picks, how far each
token is from picking others (its top-k margin), and parity data whose tokens are all far from a tie.

Why: a token whose k-th and (k+1)-th router logits lie within low-precision rounding of each other
is routed by bf16 (slideformer's run, or PyTorch's own bf16 / autocast run) to a different expert
than by the fp32 reference. That moves the token's whole contribution from one expert's gradient to
another's: on the tiny parity models (about 45 tokens per expert) one such token changes an expert's
gradient by 10-30 %, whoever computes it, which no elementwise tolerance can tell from a bug. Data
with every token's margin well above bf16 rounding makes the comparison measure the arithmetic.

    RouterTap(model, top_k)       hooks on every router: logits (float64, from the router's own input
                                  and weight) and the experts transformers really picked, per call
    topk_margin(logits, k)        [n]: (z_k - z_{k+1}) / rms(z) per row (z sorted, descending)
    fix_routing_margins(...)      replaces tokens of records until every position's margin, in every
                                  MoE layer of the fp32 model, is at least min_margin
    routing_flips(ref, other)     per layer: tokens whose chosen expert sets differ

Only torch (and the model transformers built) is used.
"""
from __future__ import annotations

# Smallest accepted top-k margin of the parity data, as a fraction of the row's router-logit RMS.
# PyTorch's bf16 router logits of the tiny models differ from fp32 by about 1-2 % of that RMS at the
# nearest ties (H200, transformers 5.17: 0.021 / 0.013 in bf16 / autocast on qwen3moe_aux); a flip
# needs an error of half the margin, so 0.15 leaves a factor of several. tools/hf_parity.py prints
# the measured largest ratio of error to margin. 27-57 % of the random tokens get replaced (measured).
MOE_MIN_MARGIN = 0.15


def router_modules(model):
    """The MoE routers in layer order: transformers v5's TopKRouter at mlp.gate, v4's nn.Linear at
    mlp.gate or block_sparse_moe.gate (each has weight [E, H]); Gemma 4's router.proj, the linear
    layer inside Gemma4TextRouter (its input is the router's normed and scaled one, its output
    the logits the router softmaxes and top-k's)."""
    out = []
    for name, mod in model.named_modules():
        if name.endswith(("mlp.gate", "block_sparse_moe.gate", "router.proj")) and \
                getattr(mod, "weight", None) is not None and mod.weight.dim() == 2:
            out.append((name, mod))
    return out


def top_k_of(config) -> int:
    """Experts per token: num_experts_per_tok (Qwen3-MoE, Mixtral, OLMoE) or Gemma 4's top_k_experts;
    config a transformers config or a config.json dict."""
    get = config.get if isinstance(config, dict) else (lambda k: getattr(config, k, None))
    return int(get("num_experts_per_tok") or get("top_k_experts"))


def _picked(output, top_k: int, n: int, E: int):
    """The experts a router call picked, [n, k] int64 on cpu: v5 routers return a tuple holding the
    indices; v4 routers return logits [n, E], which the block softmaxes (fp32) and top-k's."""
    import torch
    if isinstance(output, (tuple, list)):
        for t in output:
            if torch.is_tensor(t) and not t.is_floating_point() and t.numel() == n * top_k:
                return t.detach().reshape(n, top_k).long().cpu()
        output = next(t for t in output if torch.is_tensor(t) and t.is_floating_point() and t.numel() == n * E)
    z = output.detach().reshape(n, E).float()
    return torch.topk(torch.softmax(z, dim=-1), top_k, dim=-1).indices.cpu()


class RouterTap:
    """Context manager: while active, every router call appends (layer index, logits [n, E] float64
    computed from the call's input and weight, picked experts [n, k]) to self.calls."""

    def __init__(self, model, top_k: int):
        self.model, self.top_k = model, top_k
        self.routers = router_modules(model)
        self.calls: list[tuple[int, object, object]] = []
        self._hooks = []
        self._pending = {}

    def __enter__(self):
        import torch
        for li, (_, mod) in enumerate(self.routers):
            def pre(m, args, kwargs=None, li=li):
                h = args[0] if args else kwargs["hidden_states"]
                with torch.no_grad():  # on the cpu in float64: no autocast, no TF32
                    x = h.detach().reshape(-1, m.weight.shape[1]).cpu().double()
                    self._pending[li] = x @ m.weight.detach().cpu().double().t()

            def post(m, args, *rest, li=li):  # (kwargs, output) or (output) before torch 2.0
                z = self._pending.pop(li)
                self.calls.append((li, z, _picked(rest[-1], self.top_k, z.shape[0], z.shape[1])))

            try:
                self._hooks.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
                self._hooks.append(mod.register_forward_hook(post, with_kwargs=True))
            except TypeError:  # torch < 2.0: positional inputs only
                self._hooks.append(mod.register_forward_pre_hook(pre))
                self._hooks.append(mod.register_forward_hook(post))
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        return False

    def per_layer(self):
        """{router module name: (logits [tokens, E], picked [tokens, k])}, the calls of each router
        concatenated in call order (records in the order they were run)."""
        import torch
        out = {}
        for li in sorted({c[0] for c in self.calls}):
            zs = [c[1] for c in self.calls if c[0] == li]
            ps = [c[2] for c in self.calls if c[0] == li]
            out[self.routers[li][0]] = (torch.cat(zs, dim=0), torch.cat(ps, dim=0))
        return out


def topk_margin(logits, k: int):
    """[n] float64: gap between the k-th and (k+1)-th largest logit of each row over the row's RMS
    (the softmax keeps the order, so this is the logit distance to a different top-k set)."""
    import torch
    z = logits.double()
    if k >= z.shape[-1]:
        return torch.full((z.shape[0],), float("inf"), dtype=torch.float64)
    s = torch.sort(z, dim=-1, descending=True).values
    rms = z.pow(2).mean(dim=-1).sqrt().clamp_min(1e-30)
    return (s[:, k - 1] - s[:, k]) / rms


def routing_flips(ref: dict, other: dict) -> dict:
    """{router: [(token, experts only ref picked, experts only other picked)]} over the routers both
    have; tokens are rows of per_layer() (the same records in the same order on both sides)."""
    out = {}
    for li in sorted(set(ref) & set(other)):
        a, b = ref[li][1], other[li][1]
        if a.shape != b.shape:
            raise RuntimeError(f"routing of {li}: {list(a.shape)} vs {list(b.shape)} tokens")
        rows = []
        for n in range(a.shape[0]):
            sa, sb = set(a[n].tolist()), set(b[n].tolist())
            if sa != sb:
                rows.append((n, sorted(sa - sb), sorted(sb - sa)))
        out[li] = rows
    return out


def _min_margin_per_position(model, batch_ids, top_k: int):
    """[B, T] float64: each position's smallest top-k margin over the MoE layers (one forward of
    the equal-length rows batch_ids [B, T])."""
    import torch
    x = torch.tensor(batch_ids, dtype=torch.long)
    B, T = x.shape
    with RouterTap(model, top_k) as tap, torch.no_grad():
        model(input_ids=x)
    m = torch.full((B, T), float("inf"), dtype=torch.float64)
    for _, z, _ in tap.calls:
        m = torch.minimum(m, topk_margin(z, top_k).reshape(B, T))
    return m


def fix_routing_margins(model, recs: list[dict], seq_len: int, vocab: int, seed: int,
                        min_margin: float = MOE_MIN_MARGIN, candidates: int = 16) -> tuple[list[dict], dict]:
    """Records equal to recs but for tokens replaced (position by position, from the first) until
    every position of each record's first seq_len tokens has a top-k margin >= min_margin in every
    MoE layer of model (fp32, cpu, eval mode). A replaced token whose label was the token itself gets
    the new id as label too (labels that are -100 or differ from the input stay). Causal attention:
    a position's routing depends on earlier tokens only, so fixing from the left never undoes a fix.
    Each fix is one forward of `candidates` rows (the record with a random id at the position).
    Returns (records, {"replaced": tokens replaced, "positions": positions checked,
    "unfixed": positions left below min_margin (no candidate reached it), "min": smallest margin})."""
    import numpy as np
    top_k = top_k_of(model.config)
    rng = np.random.default_rng(seed)
    out, replaced, positions, unfixed, smallest = [], 0, 0, 0, float("inf")
    for rec in recs:
        ids = list(rec["input_ids"])
        labels = list(rec["labels"]) if "labels" in rec else None
        T = min(len(ids), seq_len)
        m = _min_margin_per_position(model, [ids[:T]], top_k)[0] if T else None  # [T]
        t = 0
        while T:
            bad = [i for i in range(t, T) if m[i] < min_margin]
            if not bad:
                break
            t = bad[0]
            cand = [int(c) for c in rng.integers(0, vocab, size=candidates) if int(c) != ids[t]]
            cm = _min_margin_per_position(model, [ids[:t] + [c] + ids[t + 1:T] for c in cand], top_k)  # [C, T]
            ok = [i for i in range(len(cand)) if cm[i, t] >= min_margin]
            best = ok[0] if ok else int(cm[:, t].argmax())
            if not ok:
                unfixed += 1
            old, ids[t] = ids[t], cand[best]
            if labels is not None and labels[t] == old:
                labels[t] = ids[t]
            m = cm[best]
            replaced += 1
            t += 1
        if T:
            smallest = min(smallest, float(m.min()))
        positions += T
        new = dict(rec, input_ids=ids)
        if labels is not None:
            new["labels"] = labels
        out.append(new)
    return out, {"replaced": replaced, "positions": positions, "unfixed": unfixed, "min": smallest}


def self_test() -> int:
    """Checks fix_routing_margins, RouterTap and routing_flips on a small causal stand-in with two
    routers (torch only, no transformers): python3 tools/moe_routing.py --self-test."""
    import types
    import torch
    torch.manual_seed(0)
    V, H, E, K, S = 50, 16, 6, 2, 25

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = torch.nn.Module()
            self.mlp.gate = torch.nn.Linear(H, E, bias=False)  # named like transformers' routers
            self.out = torch.nn.Parameter(torch.randn(E, H) * 0.3)

        def forward(self, h):  # causal: a running mean of earlier positions, then the routed update
            h = h + torch.cumsum(h, dim=1) / torch.arange(1, h.shape[1] + 1).view(1, -1, 1)
            return h + torch.tanh(self.mlp.gate(h)) @ self.out

    class StandIn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = types.SimpleNamespace(num_experts_per_tok=K)
            self.model = torch.nn.Module()
            self.model.embed = torch.nn.Embedding(V, H)
            self.model.layers = torch.nn.ModuleList([Block(), Block()])

        def forward(self, input_ids):
            h = self.model.embed(input_ids)
            for b in self.model.layers:
                h = b(h)
            return h

    m = StandIn().eval()
    rnd = lambda n: [int(x) for x in torch.randint(0, V, (n,))]  # noqa: E731
    recs = [{"input_ids": rnd(20)}, {"input_ids": rnd(30)}, {"input_ids": rnd(12)}]
    recs[1]["labels"] = list(recs[1]["input_ids"])
    recs[1]["labels"][:5] = [-100] * 5
    recs[2]["labels"] = [(x + 1) % V for x in recs[2]["input_ids"]]  # labels unlike the inputs
    fails = []

    def check(cond, what):
        if not cond:
            fails.append(what)

    before = sum(int((_min_margin_per_position(m, [r["input_ids"][:S]], K) < MOE_MIN_MARGIN).sum()) for r in recs)
    new, st = fix_routing_margins(m, recs, S, V, seed=7)
    check(before > 0 and st["replaced"] > 0, f"the stand-in had {before} near-ties, {st['replaced']} replaced")
    check(st["unfixed"] == 0 and st["positions"] == 20 + S + 12, f"stats {st}")
    for r, n in zip(recs, new):
        T = min(len(r["input_ids"]), S)
        check(len(n["input_ids"]) == len(r["input_ids"]), "length changed")
        check(n["input_ids"][S:] == r["input_ids"][S:], "tokens past seq_len changed")
        mm = _min_margin_per_position(m, [n["input_ids"][:T]], K)
        check(float(mm.min()) >= MOE_MIN_MARGIN, f"margin {float(mm.min()):.4f} left below {MOE_MIN_MARGIN}")
        if "labels" in r:
            for i, (a, b, la, lb) in enumerate(zip(r["input_ids"], n["input_ids"], r["labels"], n["labels"])):
                want = -100 if la == -100 else (b if la == a else la)
                check(lb == want, f"label {i}: {lb}, want {want}")
    with RouterTap(m, K) as tap, torch.no_grad():
        m(torch.tensor([new[0]["input_ids"]]))
        m(torch.tensor([new[2]["input_ids"]]))
    ref = tap.per_layer()
    check(sorted(ref) == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"], f"routers {sorted(ref)}")
    for z, picked in ref.values():
        check(z.shape == (32, E) and torch.equal(picked, torch.topk(z, K, dim=-1).indices), "picked != top-k")
    check(all(not v for v in routing_flips(ref, ref).values()), "flips of a routing against itself")
    other = {k: (z, p.clone()) for k, (z, p) in ref.items()}
    z1, p1 = other["model.layers.1.mlp.gate"]
    spare = [e for e in range(E) if e not in p1[3].tolist()][0]
    gone = int(p1[3, 1])
    p1[3, 1] = spare
    fl = routing_flips(ref, other)
    check(fl["model.layers.1.mlp.gate"] == [(3, [gone], [spare])] and not fl["model.layers.0.mlp.gate"],
          f"forced flip reported as {fl}")
    for f in fails:
        print("FAIL", f)
    print(f"moe_routing self-test: {st['replaced']} of {st['positions']} tokens replaced; "
          f"{'ok' if not fails else f'{len(fails)} failed'}")
    return 1 if fails else 0


if __name__ == "__main__":
    import sys
    if sys.argv[1:] != ["--self-test"]:
        print("usage: python3 tools/moe_routing.py --self-test  (the module is imported by hf_parity.py)")
        sys.exit(2)
    sys.exit(self_test())
