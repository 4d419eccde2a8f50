/* Breakout local search for MaxCut: one search, many steps per call (corral/problems/maxcut_bls.py
 * compiles this file on first use and drives it through ctypes; the same search as the numpy
 * engine there, one search at a time, without numpy's per-operation overhead).
 *
 * State (owned by the caller, read and written here):
 *   s[n]        spins, +1 / -1
 *   gain[n]     the cut's change if node i flipped: s_i * sum_j w_ij s_j (integer weights only)
 *   expiry[n]   the step until which node i is tabu (steps count from 0 up to 2^30; the caller
 *               shifts both down before that)
 *   best_s[n]   the best assignment of this search
 *   d[D_LEN]    cut, best cut, best cut at the last local optimum, previous local optimum's cut
 *               and fingerprint, the fingerprint now
 *   q[Q_LEN]    step, mode, perturbation moves left, jump magnitude L, omega
 * The graph is CSR: neighbours adj[ptr[i] .. ptr[i + 1]) with weights w (no repeated neighbour).
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { D_CUT, D_BEST, D_BEST_AT_LAST, D_PREV_CUT, D_PREV_FP, D_FP, D_LEN };
enum { Q_STEP, Q_MODE, Q_LEFT, Q_JUMP, Q_OMEGA, Q_LEN };
enum { DESCENT = 0, DIRECTED = 1, RANDOM = 2 };
enum { RAN_OUT = 0, REACHED = 1, BREAK_OUT = 2 };

static inline uint64_t next_u64(uint64_t *st) { /* splitmix64 */
    uint64_t z = (*st += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline double uniform(uint64_t *st) { return (double)(next_u64(st) >> 11) * 0x1.0p-53; }

static inline int64_t below(uint64_t *st, int64_t k) { return (int64_t)(uniform(st) * (double)k); }

static void flip(int64_t k, int8_t *s, int32_t *gain, int32_t *expiry, double *d, const int64_t *ptr,
                 const int32_t *adj, const int32_t *w, const double *fkey, int32_t step, int32_t tlo,
                 int32_t thi, uint64_t *rng) {
    int32_t sk = s[k];
    d[D_CUT] += (double)gain[k];
    d[D_FP] -= 2.0 * (double)sk * fkey[k];
    s[k] = (int8_t)(-sk);
    gain[k] = -gain[k];
    for (int64_t e = ptr[k]; e < ptr[k + 1]; e++) {
        int64_t j = adj[e];
        gain[j] -= 2 * w[e] * sk * (int32_t)s[j];
    }
    expiry[k] = step + tlo + (int32_t)below(rng, thi - tlo + 1);
}

/* The best move of a search: the largest gain, and the largest gain among nodes that are not
 * tabu or that would beat the best cut (aspiration: gain > aspire_above). Ties go to the first node
 * met in a scan that starts at a random node (one draw a step instead of one per tie). */
static void best_moves(int64_t n, const int32_t *gain, const int32_t *expiry, int32_t step, int32_t aspire_above,
                       uint64_t *rng, int64_t *k_all, int32_t *g_all, int64_t *k_adm) {
    int32_t ga = INT32_MIN, gm = INT32_MIN;
    int64_t ka = 0, km = -1;
    int64_t start = below(rng, n);
    for (int64_t part = 0; part < 2; part++) {
        int64_t lo = part ? 0 : start, hi = part ? start : n;
        for (int64_t i = lo; i < hi; i++) {
            int32_t g = gain[i];
            if (g > ga) { ga = g; ka = i; }
            if (g > gm && (expiry[i] <= step || g > aspire_above)) { gm = g; km = i; }
        }
    }
    *k_all = ka;
    *g_all = ga;
    *k_adm = km >= 0 ? km : ka;
}

/* At a local optimum: adapt omega and L, pick the perturbation. Returns 1 when the search has
 * stalled for `stall` local optima (the caller breaks it out). */
static int local_optimum(double *d, int64_t *q, int64_t l0, int64_t lmax, int64_t stall, double p0,
                         uint64_t *rng) {
    if (d[D_BEST] > d[D_BEST_AT_LAST]) q[Q_OMEGA] = 0;
    else q[Q_OMEGA] += 1;
    d[D_BEST_AT_LAST] = d[D_BEST];
    int same = d[D_CUT] == d[D_PREV_CUT] && fabs(d[D_FP] - d[D_PREV_FP]) < 1e-6;
    q[Q_JUMP] = same ? (q[Q_JUMP] + 1 < lmax ? q[Q_JUMP] + 1 : lmax) : l0;
    d[D_PREV_CUT] = d[D_CUT];
    d[D_PREV_FP] = d[D_FP];
    if (q[Q_OMEGA] > stall) return 1;
    double p_dir = exp(-(double)q[Q_OMEGA] / (double)stall);
    if (p_dir < p0) p_dir = p0;
    q[Q_MODE] = uniform(rng) < p_dir ? DIRECTED : RANDOM;
    q[Q_LEFT] = q[Q_JUMP];
    return 0;
}

/* Run up to max_steps moves. Returns REACHED once the best cut reaches stop_at, BREAK_OUT when the
 * search stalled (the caller restarts it), RAN_OUT otherwise; *done: the moves made. */
int64_t bls_run(int64_t n, const int64_t *ptr, const int32_t *adj, const int32_t *w, const double *fkey,
                int8_t *s, int32_t *gain, int32_t *expiry, int8_t *best_s, double *d, int64_t *q,
                const int64_t *ip, const double *dp, uint64_t *rng, int64_t max_steps, int64_t *done) {
    const int64_t l0 = ip[0], lmax = ip[1], stall = ip[2];
    const int32_t tlo = (int32_t)ip[3], thi = (int32_t)ip[4];
    const double p0 = dp[0], thr = dp[1], stop_at = dp[2];
    int64_t status = RAN_OUT, t = 0;
    for (; t < max_steps; t++) {
        int32_t step = (int32_t)q[Q_STEP];
        int64_t k_all, k_adm, k;
        int32_t g_all;
        /* a gain above best - cut beats the best cut (integer gains; clamped into int32) */
        double above = floor(d[D_BEST] - d[D_CUT] + thr);
        int32_t aspire = above > 2e9 ? INT32_MAX : (above < -2e9 ? INT32_MIN : (int32_t)above);
        best_moves(n, gain, expiry, step, aspire, rng, &k_all, &g_all, &k_adm);
        if (q[Q_MODE] == DESCENT && g_all <= 0 && local_optimum(d, q, l0, lmax, stall, p0, rng)) {
            status = BREAK_OUT;
            break;
        }
        if (q[Q_MODE] == RANDOM) k = below(rng, n);
        else if (q[Q_MODE] == DIRECTED) k = k_adm;
        else k = k_all;
        flip(k, s, gain, expiry, d, ptr, adj, w, fkey, step, tlo, thi, rng);
        q[Q_STEP] = step + 1;
        if (q[Q_MODE] != DESCENT && --q[Q_LEFT] <= 0) q[Q_MODE] = DESCENT;
        if (d[D_CUT] > d[D_BEST] + thr) {
            d[D_BEST] = d[D_CUT];
            memcpy(best_s, s, (size_t)n);
            if (d[D_BEST] >= stop_at - thr) {
                t++;
                status = REACHED;
                break;
            }
        }
    }
    *done = t;
    return status;
}
