"""MIMO downlink beamforming (sum rate): every method on every setting, in one run, one torch thread.

Settings: N = K in {4, 8, 16} antennas / users, SNR 10 and 20 dB (P = 10^(snr/10), noise 1), 100
Rayleigh channels each (``rayleigh:N=..,seed=0..99``, the same channels at both SNRs).

Methods (each batched over the 100 channels; ms per channel = the batch's time / 100):
  random   random CN(0, 1) beams at full power (a floor)
  zf       zero-forcing, water-filling power over the users' interference-free gains
  mmse     regularized ZF / MMSE (H^H (H H^H + K/P I)^-1), columns normalized, P/K per user
  wmmse    WMMSE (Shi et al. 2011, bisection for mu) from ZF, MMSE and --restarts random starts,
           each to a relative sum-rate change < 1e-6 or 300 iterations; the best start kept
  corral   corral's per-instance optimizer (corral.problems.mimo.ascend): starts from wmmse's
           beams plus ZF, MMSE and random starts (--starts in all), 3 phases of 100 Adam steps
           of gradient ascent + 30 WMMSE polish iterations + elite restarts; its time includes
           wmmse's
  policy   the one-pass policy (corral.problems.mimo_policy): an MLP that outputs the optimal
           structure's (lambda, p) plus --unroll unrolled WMMSE layers (learned per-layer mu scale
           and over-relaxation), trained for --train-steps steps of --train-batch channels (or
           --train-seconds of CPU time if given, whichever ends first) on fresh channels; time = inference
           only (batched, and one channel at a time: each channel's best of 5 calls, averaged
           over 20 channels); training CPU and wall seconds reported apart

    python benchmarks/bench_mimo.py --out benchmarks/data/bench_mimo.json
    python benchmarks/bench_mimo.py --sizes 4 --snrs 10 --train-steps 300   # a quick look
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

METHODS = ("random", "zf", "mmse", "wmmse", "corral", "policy")


def run_setting(n: int, snr: float, args) -> dict:
    from corral.problems import mimo
    from corral.problems.mimo_policy import time_per_channel, train_policy

    H = mimo.rayleigh(n, n, 0, args.count)
    P = mimo.power_of(snr)
    out: dict = {"n": n, "k": n, "snr": snr, "channels": args.count, "methods": {}}

    def record(name, W, seconds, **extra):
        assert bool(mimo.feasible(W, P).all()), f"{name}: infeasible beams"
        rate = mimo.sum_rate(H, W)
        out["methods"][name] = {"mean": float(rate.mean()), "std": float(rate.std()),
                                "ms_per_channel": 1e3 * seconds / args.count, "rates": rate.tolist(), **extra}
        print(f"N=K={n} snr={snr:g}: {name:<7s} {float(rate.mean()):8.3f}  {1e3 * seconds / args.count:9.3f} ms/ch",
              flush=True)
        return rate

    def timed(fn):
        t = time.perf_counter()
        W = fn()
        return W, time.perf_counter() - t

    gen = torch.Generator().manual_seed(args.seed)
    record("random", *timed(lambda: mimo.random_beams((args.count, n, n), P, gen)))
    record("zf", *timed(lambda: mimo.zero_forcing(H, P)))
    record("mmse", *timed(lambda: mimo.mmse(H, P)))
    Ww, tw = timed(lambda: mimo.wmmse_restarts(H, P, restarts=args.restarts, seed=args.seed))
    record("wmmse", Ww, tw, starts=args.restarts + 2)
    Wc, tc = timed(lambda: mimo.ascend(H, P, starts=args.starts, seed=args.seed + 1, init=Ww))
    record("corral", Wc, tw + tc, starts=args.starts, own_ms_per_channel=1e3 * tc / args.count)
    policy, info = train_policy(n, n, P, steps=args.train_steps, seconds=args.train_seconds, seed=args.seed,
                                unroll=args.unroll, batch=args.train_batch, lr=args.lr, clip=args.clip)
    Wp, _ = timed(lambda: policy.act(H))
    speed = time_per_channel(policy, H)
    record("policy", Wp, speed["ms_batched"] * args.count / 1e3, ms_single=speed["ms_single"], **info)
    return out


def table(results: list[dict]) -> str:
    lines = ["| N = K | SNR (dB) | " + " | ".join(METHODS) + " | corral / wmmse | policy / wmmse |"
             " ms per channel: wmmse / corral / policy (batched, single) | policy training |",
             "| --- " * (len(METHODS) + 6) + "|"]
    for r in results:
        m = r["methods"]
        ref = m["wmmse"]["mean"]
        p = m["policy"]
        lines.append(f"| {r['n']} | {r['snr']:g} | " + " | ".join(f"{m[x]['mean']:.3f}" for x in METHODS) +
                     f" | {m['corral']['mean'] / ref:.4f} | {p['mean'] / ref:.4f} | "
                     f"{m['wmmse']['ms_per_channel']:.1f} / {m['corral']['ms_per_channel']:.1f} / "
                     f"{p['ms_per_channel']:.3f}, {p['ms_single']:.3f} | {p['steps']} steps, "
                     f"{p['train_seconds']:.0f} CPU-s |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--snrs", type=float, nargs="+", default=[10.0, 20.0])
    ap.add_argument("--count", type=int, default=100, help="channels per setting (seeds 0..count-1)")
    ap.add_argument("--restarts", type=int, default=8, help="wmmse's random starts (besides ZF and MMSE)")
    ap.add_argument("--starts", type=int, default=16, help="corral's starts per channel")
    ap.add_argument("--train-steps", type=int, default=2000)
    ap.add_argument("--train-batch", type=int, default=256)
    ap.add_argument("--train-seconds", type=float, default=None,
                    help="cap on the policy's training CPU seconds (default none: the step count alone, so the "
                         "training is the same on a busy core as on an idle one)")
    ap.add_argument("--unroll", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3, help="the policy's Adam learning rate (cosine schedule)")
    ap.add_argument("--clip", type=float, default=1.0, help="the policy's gradient-norm clip (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the JSON results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    results = [run_setting(n, snr, args) for n in args.sizes for snr in args.snrs]
    print("\n" + table(results))
    wall = time.perf_counter() - t0
    print(f"\nwall time {wall:.0f} s (one torch thread)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "wall_seconds": wall, "torch": torch.__version__,
                                              "results": results}, indent=1))


if __name__ == "__main__":
    main()
