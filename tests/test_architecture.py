"""Dependencies point one way (asrkit/__init__.py draws the layers); inference needs no
training code and no optimizer state."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "asrkit"

# Lower rank = lower layer. A module may import modules of a strictly lower rank, or of
# its own top-level part (a package's modules import each other).
RANKS = {
    "asrkit": 0, "errors": 0, "sizes": 0, "outputs": 1,
    "config": 1, "progress": 1, "cluster": 1,
    "audio": 2, "tokenizer": 2, "metrics": 2, "ngram": 2,
    "features": 3, "nemo_mel": 2,
    # peers: the network and its losses never read data, data never builds a network
    "data": 5, "models": 5, "losses": 5,
    "checkpoints": 6,
    "experiment": 7, "curves": 7,
    "decoding": 8, "importers": 8,
    "export": 9,
    "training": 10,
    "cli": 11,
}  # fmt: skip


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "asrkit"


def _imports(path: Path) -> set[str]:
    """Every asrkit module a file imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "asrkit"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} if node.module.split(".")[0] == "asrkit" else set()
    return found


def test_every_import_points_down():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        mine = _part(module)
        assert mine in RANKS, f"{path}: place '{mine}' in the layer map"
        for imported in _imports(path):
            theirs = _part(imported)
            if theirs == "asrkit" and imported == "asrkit":
                continue  # __version__
            if theirs != mine and RANKS[theirs] >= RANKS[mine]:
                upward.append(f"{module} imports {imported}")
    assert not upward, "\n".join(upward)


def test_the_import_check_would_catch_an_upward_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from asrkit.training.trainer import train\n")
    assert _imports(bad) == {"asrkit.training.trainer"}


def test_nothing_outside_cli_imports_cli():
    for path in [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "tools").glob("*.py")]:
        if "cli" in path.relative_to(PACKAGE.parent).parts:
            continue
        assert not any(_part(m) == "cli" for m in _imports(path)), path


def test_decoding_models_and_export_do_not_import_training():
    code = (
        "import sys, asrkit.decoding, asrkit.models.transducer, asrkit.export, asrkit.experiment\n"
        "print(sorted(m for m in sys.modules if m.startswith('asrkit.training')))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_a_model_loaded_for_inference_has_no_optimizer_state(tmp_path):
    import keras

    from asrkit.checkpoints import CheckpointManager, TrainState
    from asrkit.config import DataConfig, ExperimentConfig, dump_config
    from asrkit.experiment import adopt_assets, build_network, load_experiment
    from asrkit.tokenizer import train_tokenizer
    from tests.tiny import tiny_model_config

    tok = train_tokenizer(["A B C", "ABC CBA"] * 3, tmp_path / "tok", 6, "char")
    config = ExperimentConfig(
        model=tiny_model_config(), data=DataConfig(tokenizer=str(tmp_path / "tok"))
    )
    exp = tmp_path / "exp"
    (exp).mkdir()
    (exp / "config.yaml").write_text(dump_config(adopt_assets(config, exp)))
    network = build_network(config, tok.vocab_size)
    CheckpointManager(exp / "checkpoints").save(network, TrainState(0, 0, 1))
    loaded = load_experiment(exp).network
    assert isinstance(loaded, keras.Model) and getattr(loaded, "optimizer", None) is None
    assert [v.shape for v in loaded.variables] == [v.shape for v in network.variables]
    assert not any("accum" in v.path or "optimizer" in v.path for v in loaded.variables)


def test_no_module_imports_another_modules_private_names():
    """Modules share code through public names (the losses' lattice, chunks and cells)."""
    private = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("asrkit"):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]  # fmt: skip
    assert not private, "\n".join(private)


def _tf_functions_with_autograph(source: str) -> list[int]:
    """Lines naming `tf.function` other than as `tf.function(..., autograph=False)` or
    `partial(tf.function, ..., autograph=False)` (a bare `@tf.function` included)."""

    def is_tf_function(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "function"
                and isinstance(node.value, ast.Name) and node.value.id == "tf")  # fmt: skip

    def autograph_off(call: ast.Call) -> bool:
        off = [k.value for k in call.keywords if k.arg == "autograph"]
        return bool(off) and isinstance(off[0], ast.Constant) and off[0].value is False

    tree = ast.parse(source)
    allowed = set()
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and autograph_off(n)):
        name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
        wrapped = call.args[0] if name == "partial" and call.args else call.func
        allowed.add(id(wrapped))
    return sorted(n.lineno for n in ast.walk(tree) if is_tf_function(n) and id(n) not in allowed)


def test_every_graph_asrkit_traces_is_traced_without_autograph():
    """asrkit's graphs are TensorFlow ops and loops, with no Python control flow on tensors:
    AutoGraph would only re-parse their source at each trace. The tests and tools trace
    theirs the same way, so they test the graphs asrkit runs (and spend no time in
    AutoGraph's source conversion)."""
    top = PACKAGE.parent
    paths = sorted(p for d in (PACKAGE, top / "tests", top / "tools") for p in d.rglob("*.py"))
    found = [f"{path.relative_to(top)}:{line}" for path in paths
             for line in _tf_functions_with_autograph(path.read_text())]  # fmt: skip
    assert not found, "tf.function without autograph=False:\n" + "\n".join(found)
    sample = ("f = tf.function(g)\nh = functools.partial(tf.function, jit_compile=True)\n"
              "k = tf.function(g, autograph=False)\n@tf.function\ndef m(): pass\n"
              "n = partial(tf.function, autograph=False)\n")  # fmt: skip
    assert _tf_functions_with_autograph(sample) == [1, 2, 4]
