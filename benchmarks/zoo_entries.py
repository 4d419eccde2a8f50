"""Walk rl-zoo's bundled hyperparameter entries and run each one corral can, through `--zoo`.

For every entry of rl_zoo3's ``hyperparams/*.yml`` whose algorithm corral has and whose env
is installed here, run ``corral train ALGO ENV --zoo --steps N`` in this process (a small
step override: the entry's keys, not its budget, are what is checked) and print a table:
ran (with the final evaluation's return), refused (with the reasons, corral/zoo/) or
failed (with the error), then the counts and the refusal reasons grouped.

The ``atari`` entry runs on one ALE game (--atari-game), a ``default`` entry on the first
classic-control env its file has no entry of its own for. Entries whose algorithm corral
lacks or whose env is not installed are counted, not run.

    python benchmarks/zoo_entries.py                 # every entry, 2,000 steps each
    python benchmarks/zoo_entries.py --steps 500 --only ppo/CartPole-v1,dqn/CartPole-v1
    python benchmarks/zoo_entries.py --limit 3 --json out.json

Needs rl_zoo3 (pip install 'corral[zoo]'). tests/test_zoo.py runs it on a sample.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import sys
import tempfile
import time
import warnings

DISCRETE_ONLY = {"dqn", "qrdqn"}
CONTINUOUS_ONLY = {"sac", "td3", "ddpg", "tqc", "crossq"}
DEFAULT_CANDIDATES = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1", "MountainCarContinuous-v0",
                      "InvertedPendulum-v5", "CartPoleNoVel-v1"]  # (the last: dqn.yml has every discrete one above)


def env_status(env_id: str) -> tuple[bool, str]:
    """Whether the env can be made here, resolved as a run resolves it (ALE, PyBullet, MiniGrid
    and corral's own ids register on demand): registered and its dependencies installed."""
    import gymnasium as gym

    from corral.envs.make import make_factory

    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            env = make_factory(env_id, {}, atari_wrappers=False)()
            discrete = isinstance(env.action_space, gym.spaces.Discrete)
            env.close()
        return True, "discrete" if discrete else "continuous"
    except Exception as e:  # not registered, or its package (mujoco-py, pybullet, ...) missing
        return False, f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def env_for(algo: str, key: str, data: dict, atari_game: str) -> str | None:
    """The env an entry runs on: its own key, one ALE game for 'atari', a classic env for 'default'."""
    if key == "atari":
        return atari_game
    if key != "default":
        return key
    for env_id in DEFAULT_CANDIDATES:
        if env_id in data:
            continue
        ok, kind = env_status(env_id)
        if ok and not (algo in DISCRETE_ONLY and kind != "discrete") and \
                not (algo in CONTINUOUS_ONLY and kind != "continuous"):
            return env_id
    return None


def entries() -> list[tuple[str, str, dict]]:
    from corral import config as C
    from corral.zoo import bundled_files

    out = []
    for path in bundled_files():
        data = C.load_yaml(str(path))
        out += [(path.stem, key, data) for key in data]
    return out


def run_entry(algo: str, env_id: str, steps: int, seed: int) -> dict:
    """``corral train ALGO ENV --zoo --steps N --json`` in this process."""
    from corral.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        argv = ["train", algo, env_id, "--zoo", "--steps", str(steps), "--seed", str(seed), "--json",
                "--run-dir", f"{tmp}/run", "--set", "eval.episodes=2", "--set", "eval.num_envs=1",
                "--set", "tensorboard=false", "--set", "progress=false"]
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rc = main(argv)
        except Exception as e:  # a crash is a result here, not the end of the walk
            return {"result": "failed", "why": f"{type(e).__name__}: {e}"[:300], "seconds": time.perf_counter() - t0}
        seconds = time.perf_counter() - t0
        if rc != 0:
            lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("corral:")] or err.getvalue().splitlines()
            return {"result": "failed", "why": (lines[-1] if lines else f"exit {rc}")[:300], "seconds": seconds}
        summary = json.loads(out.getvalue().strip().splitlines()[-1])
        return {"result": "ran", "eval_return": summary.get("eval_return"), "env_steps": summary["env_steps"],
                "seconds": seconds}


def walk(steps: int = 2000, seed: int = 0, only: list[str] | None = None, limit: int | None = None,
         atari_game: str = "ALE/Pong-v5", out=sys.stdout) -> dict:
    """Run the walk; returns the rows and the counts (``ran``, ``refused``, ``failed``, and the
    entries not run: ``algo missing``, ``env not installed``)."""
    from corral.algos import ALGOS
    from corral.train.setup import _is_atari
    from corral.zoo import missing_algo_reason, translate

    rows = []
    for algo, key, data in entries():
        if only and f"{algo}/{key}" not in only:
            continue
        if limit is not None and sum(r["result"] in ("ran", "refused", "failed") for r in rows) >= limit:
            break
        row = {"algo": algo, "entry": key, "env": None}
        rows.append(row)
        if algo not in ALGOS:
            row.update(result="algo missing", why=missing_algo_reason(algo))
            continue
        env_id = env_for(algo, key, data, atari_game)
        row["env"] = env_id
        ok, why = env_status(env_id) if env_id else (False, "no installed env suits the default entry")
        if not ok:
            row.update(result="env not installed", why=why)
            continue
        t = translate(algo, data, env_id, is_atari=_is_atari(env_id), source=f"{algo}.yml")
        if t.refused:
            row.update(result="refused", why="; ".join(f"{k}: {v}" for k, v in t.refused.items()),
                       reasons=dict(t.refused))
        else:
            row.update(run_entry(algo, env_id, steps, seed))
        _print_row(row, out)
    counts = collections.Counter(r["result"] for r in rows)
    return {"rows": rows, "counts": dict(counts), "steps": steps}


def _print_row(row: dict, out) -> None:
    name = f"{row['algo']}/{row['entry']}" + (f" ({row['env']})" if row["env"] and row["env"] != row["entry"] else "")
    if row["result"] == "ran":
        ret = row.get("eval_return")
        detail = f"eval {ret:.1f}" if isinstance(ret, (int, float)) else "no eval"
        detail += f", {row['seconds']:.0f} s"
    else:
        detail = row["why"]
    print(f"{name:52s} {row['result']:8s} {detail}", file=out, flush=True)


def report(result: dict, out=sys.stdout) -> None:
    c = result["counts"]
    print(f"\n{sum(c.values())} entries: {c.get('ran', 0)} ran, {c.get('refused', 0)} refused, "
          f"{c.get('failed', 0)} failed; not run: {c.get('algo missing', 0)} algorithm not in corral, "
          f"{c.get('env not installed', 0)} env not installed ({result['steps']} steps each)", file=out)
    reasons = collections.defaultdict(list)
    for r in result["rows"]:
        for k, why in r.get("reasons", {}).items():
            reasons[f"{k}: {why}"].append(f"{r['algo']}/{r['entry']}")
    if reasons:
        print("refusal reasons (entries):", file=out)
        for why, names in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            print(f"  {len(names):3d}  {why}\n       {', '.join(names)}", file=out)
    failed = [r for r in result["rows"] if r["result"] == "failed"]
    if failed:
        print("failed:", file=out)
        for r in failed:
            print(f"  {r['algo']}/{r['entry']}: {r['why']}", file=out)
    not_run = collections.defaultdict(list)
    for r in result["rows"]:
        if r["result"] in ("algo missing", "env not installed"):
            not_run[f"{r['result']}: {r['why']}"].append(f"{r['algo']}/{r['entry']}")
    if not_run:
        print("not run (entries):", file=out)
        for why, names in sorted(not_run.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            print(f"  {len(names):3d}  {why}\n       {', '.join(names)}", file=out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000, help="env steps per entry (the entry's n_timesteps is not run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", help="comma-separated algo/entry names, e.g. ppo/CartPole-v1,dqn/atari")
    p.add_argument("--limit", type=int, help="stop after this many entries ran, were refused or failed")
    p.add_argument("--atari-game", default="ALE/Pong-v5", help="the game the 'atari' entries run on")
    p.add_argument("--json", help="also write the rows and counts to this file")
    a = p.parse_args(argv)
    import importlib.util

    if importlib.util.find_spec("rl_zoo3") is None:  # only its files are read: no import
        print("zoo_entries.py needs rl_zoo3: pip install 'corral[zoo]'", file=sys.stderr)
        return 2
    result = walk(a.steps, a.seed, a.only.split(",") if a.only else None, a.limit, a.atari_game)
    report(result)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 1 if result["counts"].get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
