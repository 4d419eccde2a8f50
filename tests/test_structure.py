"""Structure (issue 36): no caller tests an algorithm's class or probes its attributes, no
algorithm borrows another's methods or swaps its class in ``__new__``; what a caller needs to
know is declared on the class (``corral/algos/base.py``). No package-level import cycles are
checked in tests/test_imports.py; here, that packages import only downward (``LAYERS``, with the
upward imports not removed yet in a list that can only shrink), and sizes: no file in corral/
over 500 lines, no function over 80.

The checker runs on the source tree, and each pattern the issue names is fed to it as a
snippet, so a test that cannot fail would show here."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import corral.algos  # noqa: F401 - imports every algorithm module
from corral.algos.base import Algorithm

ROOT = Path(__file__).resolve().parent.parent / "corral"


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def algorithm_classes() -> dict[str, str]:
    """Every Algorithm class in corral: name -> the file defining it (relative to corral/)."""
    out = {"Algorithm": "algos/base.py"}
    for cls in _subclasses(Algorithm):
        if not cls.__module__.startswith("corral."):
            continue
        path = Path(inspect.getsourcefile(cls)).resolve()
        if ROOT in path.parents:
            out.setdefault(cls.__name__, str(path.relative_to(ROOT)))
    return out


ALGO_NAMES = algorithm_classes()
# what callers hold an algorithm in
HOLDERS = {"algo", "old", "new", "cls", "spec_cls", "algo_cls"}


def _holder(node: ast.AST) -> bool:
    """``algo``, ``old``, ``cls``, ``self.algo``, ``learner.algo``, ``type(algo)`` ..."""
    if isinstance(node, ast.Name):
        return node.id in HOLDERS
    if isinstance(node, ast.Attribute):
        return node.attr in ("algo", "algo_cls")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type":
        return bool(node.args) and _holder(node.args[0])
    return False


def _algo_class_ref(node: ast.AST, own: str) -> str | None:
    """The name of an algorithm class ``node`` refers to, where it is defined in another file."""
    names = []
    if isinstance(node, ast.Tuple):
        for elt in node.elts:
            names.append(elt)
    else:
        names.append(node)
    for n in names:
        if isinstance(n, ast.Name) and n.id in ALGO_NAMES and ALGO_NAMES[n.id] != own:
            return n.id
    return None


def violations(source: str, rel: str) -> list[str]:
    """What ``source`` (the file ``rel`` under corral/) does that the structure rules forbid."""
    tree = ast.parse(source)
    out = []
    in_algos = rel.startswith("algos/")
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            fn, args = node.func.id, node.args
            if fn in ("isinstance", "issubclass") and len(args) == 2 and _algo_class_ref(args[1], rel):
                out.append(f"{rel}:{line}: {fn} against the algorithm class {_algo_class_ref(args[1], rel)}")
            # getattr(algo, name) over a declaration (``networks``) is the contract; a literal name is a probe
            if fn in ("getattr", "hasattr") and len(args) >= 2 and _holder(args[0]) and not in_algos \
                    and isinstance(args[1], ast.Constant):
                out.append(f"{rel}:{line}: {fn} probes an algorithm for {args[1].value!r}")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            is_type = any(isinstance(s, ast.Call) and isinstance(s.func, ast.Name) and s.func.id == "type"
                          for s in sides)
            for s in sides:
                ref = _algo_class_ref(s, rel) if is_type else None
                if ref:
                    out.append(f"{rel}:{line}: type(...) compared with the algorithm class {ref}")
                # whether a subclass overrides a method: only the base skips its own no-op hooks (step_hooks)
                if isinstance(s, ast.Attribute) and isinstance(s.value, ast.Name) and s.value.id in ALGO_NAMES \
                        and rel != "algos/base.py" and isinstance(node.ops[0], (ast.Is, ast.IsNot)):
                    out.append(f"{rel}:{line}: compares with {s.value.id}.{s.attr} (a class's method probed)")
        if isinstance(node, ast.Attribute) and node.attr == "fget" and isinstance(node.value, ast.Attribute) \
                and isinstance(node.value.value, ast.Name) and node.value.value.id in ALGO_NAMES:
            out.append(f"{rel}:{line}: borrows {node.value.value.id}.{node.value.attr} (a property's getter)")
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__new__" and in_algos:
                    out.append(f"{rel}:{item.lineno}: {node.name}.__new__ picks a class (declare a registry variant)")
                if isinstance(item, ast.Assign):
                    values = item.value.elts if isinstance(item.value, ast.Tuple) else [item.value]
                    for v in values:
                        if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) \
                                and v.value.id in ALGO_NAMES and v.value.id != node.name:
                            out.append(f"{rel}:{item.lineno}: {node.name} borrows {v.value.id}.{v.attr}")
    return out + _super_skips(tree, rel)


def _super_skips(tree: ast.AST, rel: str) -> list[str]:
    """``super(X, self)`` with ``X`` not the enclosing class: it jumps past the parents' methods
    (a subclass undoing its parent's constructor is asking for a shared base)."""
    out = []

    def visit(node: ast.AST, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "super" \
                    and child.args and not (isinstance(child.args[0], ast.Name) and child.args[0].id == cls):
                out.append(f"{rel}:{child.lineno}: super({ast.unparse(child.args[0])}, ...) in "
                           f"{cls or 'a function'} skips the methods between")
            visit(child, child.name if isinstance(child, ast.ClassDef) else cls)

    visit(tree, None)
    return out


def test_no_caller_tests_or_probes_an_algorithm_and_no_algorithm_borrows_another():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        found += violations(path.read_text(), rel)
    assert not found, "\n".join(found)


# each pattern the issue found, as it was written: the checker must flag every one
EXAMPLES = {
    "grad.py picks the sharded class": ("schemes/grad.py", "def f(algo):\n    if type(algo) is PPO:\n        pass\n"),
    "grad.py isinstance": ("schemes/grad.py", "def f(algo):\n    return isinstance(algo, OffPolicy)\n"),
    "fragments.py env_columns": ("schemes/fragments.py", "def f(old):\n    return getattr(old, 'env_columns', 1)\n"),
    "learner.py multi_agent_collectors": ("train/learner.py",
                                          "def f(cls):\n    return getattr(cls, 'multi_agent_collectors', False)\n"),
    "QMIX.__new__": ("algos/qmix.py", "class QMIX:\n    def __new__(cls, cfg=None):\n        return object.__new__(cls)\n"),
    "ppo.py make_actor probe": ("algos/ppo.py",
                                "def f(self):\n    return type(self).make_actor is not PPO.make_actor\n"),
    "maddpg borrows TD3": ("algos/maddpg.py", "class MADDPG:\n    _actor_step = TD3._actor_step\n"),
    "recurrent_ppo borrows IMPALA": ("algos/recurrent_ppo.py",
                                     "class RecurrentIMPALA:\n    prepare_batch = IMPALA.prepare_batch\n"),
    "r2d2 DQN.epsilon.fget": ("algos/r2d2.py", "def f(self):\n    return DQN.epsilon.fget(self)\n"),
    "offpolicy _make_replay probe": ("algos/offpolicy.py",
                                     "def f(self):\n    return type(self)._make_replay is not OffPolicy._make_replay\n"),
    "a learner probing its algo": ("train/hooks.py", "def f(learner):\n    return hasattr(learner.algo, 'replay')\n"),
    "the loop probing hooks": ("train/learner.py",
                               "def f(kind):\n    return kind.rewarded is not Algorithm.rewarded\n"),
    "estimate probing the replay": ("bench/estimate.py",
                                    "def f(learner):\n    return getattr(learner.algo, 'replay', None)\n"),
    "ppo_icm skips PPO-RND's constructor": ("algos/ppo_icm.py",
                                           "class PPOICM(PPORND):\n    def __init__(self, cfg):\n"
                                           "        super(PPORND, self).__init__(cfg)\n"),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_checker_flags_each_pattern_the_issue_found(name):
    rel, src = EXAMPLES[name]
    assert violations(src, rel), name


def test_the_checker_leaves_declarations_and_own_files_alone():
    ok = ("def f(algo):\n    return algo.grad_sharding, type(algo).multi_agent_collectors\n"
          "class TD3(DelayedActor, ActorCriticOffPolicy):\n    name = 'td3'\n")
    assert violations(ok, "schemes/grad.py") == []
    assert violations("def f(self):\n    return isinstance(self, DQN)\n", "algos/dqn.py") == []
    own = "class PPOICM(BonusPPO):\n    def __init__(self, cfg):\n        super(PPOICM, self).__init__(cfg)\n"
    assert violations(own, "algos/ppo_icm.py") == []


def test_no_file_over_500_lines_and_no_function_over_80():
    long = set()
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        if text.count("\n") > 500:
            long.add(rel)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.add(f"{rel}:{node.name}")
    assert not long, f"over the limits (split them into parts): {sorted(long)}"


# --- package layers (issue 36 item 3): each package or top-level module of corral/ imports only
# from its own layer or the layers below it. The order is what the code is: errors and the other
# leaves, then envs, nets, the parts built on them (actors, storage, exploration), algorithms,
# composition, training, the distributed schemes, the user-facing agent, applications, the CLI.
LAYERS = (
    ("errors", "rng", "optim", "returns", "config", "config_aliases", "kernels", "policy"),
    ("envs",),
    ("nets",),
    ("actors", "storage", "exploration"),
    ("algos",),
    ("compose", "zoo"),
    ("train",),
    ("schemes",),
    ("export", "agent"),
    # applications, and the package's own __init__ (the public API; bench reads its version)
    ("problems", "population", "bench", "solve", "corral"),
    ("cli",),
)

# Imports against the layers not removed yet, each as (importing module, the unit it imports),
# with the reason. The list can only shrink: an entry that no longer occurs must leave it (the
# test fails otherwise), and a new upward import fails until it is removed or justified here.
# Empty: the learner's scheme, the last one, is registered by corral.schemes
# (corral.train.scheme_factory) instead of imported.
BACK_EDGES_YET: dict[tuple[str, str], str] = {}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports() -> set[tuple[str, str]]:
    """Every (module, unit) where ``module`` imports from a unit in a higher layer than its own."""
    from tests.test_imports import import_graph

    rank = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
    graph = import_graph(allowed={})
    unplaced = {_unit(m) for m in graph} - set(rank)
    assert not unplaced, f"place these in LAYERS (tests/test_structure.py): {sorted(unplaced)}"
    return {(src, _unit(dst)) for src, deps in graph.items() for dst in deps
            if rank[_unit(dst)] > rank[_unit(src)]}


def test_packages_import_only_from_their_layer_or_below():
    found = upward_imports()
    new = found - set(BACK_EDGES_YET)
    assert not new, "imports against the layers (LAYERS in tests/test_structure.py): " + ", ".join(
        f"{src} -> {unit}" for src, unit in sorted(new))
    gone = set(BACK_EDGES_YET) - found
    assert not gone, f"no longer imported, take them off BACK_EDGES_YET: {sorted(gone)}"


def test_the_layer_check_sees_an_upward_import(monkeypatch):
    """The check on a made-up back-edge: envs importing an algorithm (video's old import) is flagged."""
    from tests import test_imports

    graph = test_imports.import_graph(allowed={})
    graph["corral.envs.video"] = graph["corral.envs.video"] | {"corral.algos.base"}
    monkeypatch.setattr(test_imports, "import_graph", lambda allowed=None: graph)
    assert ("corral.envs.video", "algos") in upward_imports()
    assert all(unit in {u for layer in LAYERS for u in layer} for _, unit in upward_imports())


# --- the Learner starts a distributed scheme without importing the schemes (they register it)


def test_a_learner_runs_two_collectors_after_a_bare_import_of_the_learner_module():
    """``import corral.train.learner`` alone (the package's __init__ runs first and registers the
    schemes): ``Learner(...).train()`` with scheme.collectors=2 runs the local fragment scheme."""
    import subprocess
    import sys

    code = (
        "import corral.train.learner\n"
        "from corral.train.learner import Learner  # (corral.train is also corral's train function)\n"
        "from corral.train.setup import build_config\n"
        "cfg = build_config('ppo', 'CartPole-v1', steps=512, seed=0, use_preset=False, overrides={\n"
        "    'scheme.collectors': 2, 'scheme.backend': 'local', 'eval.episodes': 0, 'ppo.n_steps': 32,\n"
        "    'ppo.batch_size': 64, 'ppo.n_epochs': 1, 'env.num_envs': 2})\n"
        "learner = Learner(cfg, quiet=True)\n"
        "summary = learner.train()\n"
        "print(type(learner.scheme).__name__, summary['env_steps'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=ROOT.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["FragmentScheme", "512"], out.stdout


def test_an_unregistered_scheme_is_one_message_naming_the_fix(monkeypatch):
    from corral.errors import UserError
    from corral.train import scheme_factory

    monkeypatch.setattr(scheme_factory, "_FACTORY", [])
    with pytest.raises(UserError, match="import corral.schemes"):
        scheme_factory.make_scheme(object())
