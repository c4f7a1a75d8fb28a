# attn_units_model.py: a pure-Python model of the warp-unit key loop of
# decode attention written in commit 4c170f7 (reverted in 9e109b7, not yet
# run on a GPU): the same units, parts, lanes, key slices, shuffle sums,
# online softmax and per-head merge, checked against direct softmax
# attention. It checks the kernel's indexing, not its compiled code.
#   python3 bench/attn_units_model.py      (prints the max error per shape)
# Pure-Python simulation of the new key loop: units, parts, lanes, slices, shuffles, combine, vs direct softmax.
import math, random
def sim(G, hd, EL, nkeys, chunk, warps=8, swz_on=True):
    hb = hd // EL
    units = G if G >= warps else warps // G * G
    J = units // G
    q = [[random.gauss(0,1) for _ in range(hd)] for _ in range(G)]
    K = [[random.gauss(0,1) for _ in range(hd)] for _ in range(nkeys)]
    V = [[random.gauss(0,1) for _ in range(hd)] for _ in range(nkeys)]
    scale = 1/math.sqrt(hd)
    uacc = [[0.0]*hd for _ in range(units)]; um=[-math.inf]*units; ul=[0.0]*units
    S = 1
    while S*2*hb <= 32: S *= 2
    PW = 32//S
    for c0 in range(0, nkeys, chunk):
        nk = min(chunk, nkeys-c0); part = (nk+J-1)//J
        sc = [[None]*chunk for _ in range(G)]
        for w in range(warps):
            for u in range(w, units, warps):
                g = u//J; k0 = (u-g*J)*part; k1 = min(nk, k0+part)
                if k0 >= k1: continue
                p = sc[g]
                mxl = [-math.inf]*32
                for lane in range(32):
                    for k in range(k0+lane, k1, 32):
                        d = sum(q[g][i]*K[c0+k][i] for i in range(hd))*scale
                        p[k] = d; mxl[lane] = max(mxl[lane], d)
                m_old = um[u]; m_new = max(m_old, max(mxl))
                s = 0.0
                for lane in range(32):
                    for k in range(k0+lane, k1, 32):
                        p[k] = math.exp(p[k]-m_new); s += p[k]
                corr = math.exp(m_old-m_new) if m_old != -math.inf else 0.0
                for g0 in range(0, hb, PW):
                    accs = {}
                    for lane in range(32):
                        sl, cl = lane//PW, lane%PW; c = g0+cl
                        acc = [0.0]*EL
                        if c < hb:
                            for k in range(k0+sl, k1, S):
                                for e in range(EL): acc[e] += p[k]*V[c0+k][c*EL+e]
                        accs[lane] = acc
                    off = PW
                    while off < 32:
                        accs = {l: [accs[l][e]+accs[l^off][e] for e in range(EL)] for l in range(32)}
                        off <<= 1
                    for lane in range(32):
                        sl, cl = lane//PW, lane%PW; c = g0+cl
                        if c < hb and sl == 0:
                            for e in range(EL): uacc[u][c*EL+e] = uacc[u][c*EL+e]*corr + accs[lane][e]
                um[u] = m_new; ul[u] = ul[u]*corr + s
    # combine
    out = []
    for g in range(G):
        mx = max(um[g*J+j] for j in range(J))
        ws = [0.0 if um[g*J+j] == -math.inf else math.exp(um[g*J+j]-mx) for j in range(J)]
        l = sum(ws[j]*ul[g*J+j] for j in range(J))
        out.append([sum(ws[j]*uacc[g*J+j][d] for j in range(J))/l for d in range(hd)])
    # reference
    err = 0
    for g in range(G):
        s = [sum(q[g][i]*K[k][i] for i in range(hd))*scale for k in range(nkeys)]
        m = max(s); e = [math.exp(x-m) for x in s]; z = sum(e)
        ref = [sum(e[k]*V[k][d] for k in range(nkeys))/z for d in range(hd)]
        err = max(err, max(abs(a-b) for a,b in zip(out[g], ref)))
    return err
random.seed(1)
for args in [(4,128,8,36,128),(4,64,8,36,128),(4,128,4,70,32),(1,16,8,5,16),(2,8,8,3,16),(32,64,4,20,16),(7,96,8,40,16),(8,256,4,50,16),(3,32,8,1,16),(1,256,8,100,16)]:
    print(args, "%.2e" % sim(*args))
