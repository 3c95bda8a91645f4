# session 23: the persistent forward's greedy dispatch of query tiles in supergroup_order's order
# (132 CTAs, a tile costing its key tiles + c0), packed rows of 2048 with records of 512 against
# unpacked 512-token rows, hd 64, 32/8 heads. Printed: makespan, perfect balance, their ratio.
import heapq
def order(n_qt, n_hb, unit, gbytes, sgbytes=8<<20):
    groups = max(1, sgbytes // max(gbytes,1)); sgu = min(groups*unit, n_hb); per_sg = n_qt*sgu
    out=[]
    for i in range(n_qt*n_hb):
        sg, r = divmod(i, per_sg); size = min(sgu, n_hb - sg*sgu)
        lvl = r // size; hb = sg*sgu + r % size
        out.append((n_qt-1-lvl, hb))
    return out
def sim(tiles, cost, ctas=132, c0=0.5):
    h=[(0.0,i) for i in range(ctas)]; heapq.heapify(h); tot=0
    for t in tiles:
        f,i = heapq.heappop(h); c = cost(t)+c0; tot += c; heapq.heappush(h,(f+c,i))
    mk = max(x[0] for x in h); return mk, tot/ctas
for c0 in (0.0, 0.5, 1.0):
    p = order(16, 256, 4, 4*2048*64); u = order(4, 1024, 4, 4*512*64)
    mp, ip = sim(p, lambda t: t[0]%4+1, c0=c0); mu, iu = sim(u, lambda t: t[0]+1, c0=c0)
    print(f"c0={c0}: packed makespan {mp:.1f} ideal {ip:.1f} ({ip/mp:.3f}); unpacked {mu:.1f} ideal {iu:.1f} ({iu/mu:.3f})")
