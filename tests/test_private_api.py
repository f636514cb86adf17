"""Every place where the library touches a private attribute of another library, with its reason.

A private attribute (one leading underscore) is no promise: a minor release of torch, OLMo-core,
omegaconf or transformers may rename it or change what it means, and the code here would then
break silently. Found by reading the library's source (``ast``) and, for subclasses, the classes
themselves:

- ``use``: ``x._name`` read, called or assigned, where ``x`` is not ``self``/``cls``/``super()``
  (``os._exit`` is public: the os module documents it);
- ``override``: a subclass of a torch or OLMo-core class defining, or assigning on ``self``, a
  private name its base already has (a method or a field of the base replaced);
- ``setattr``: ``setattr(...)`` or an assignment to an attribute of an imported module or class
  (a patch, whatever the name).

A new one fails this test until it is listed below with why no public way serves; one listed here
that is gone fails it too (the list stays true).
"""

import ast
import functools
import importlib
import inspect

from .conftest import REPO

PACKAGE = REPO / "olmo_patches"
PUBLIC = {"os._exit"}  # documented despite the underscore
BASE_LIBRARIES = ("torch", "olmo_core")

# (file, function or class, what) -> why no public way serves.
LISTED = {
    # The standard library, public: a console command runs a script's main() with its arguments.
    (
        "commands.py",
        "run_command",
        "setattr sys.argv",
    ): "sys.argv is public; scripts' main() reads it",
    # transformers: generate compiles its decode step on CUDA (and XLA-like devices) only; its
    # CompileConfig's _compile_all_devices is the one switch for others (a CPU's figures).
    ("export/generation.py", "_generate", "use config._compile_all_devices"): (
        "transformers compiles generation on CUDA only; no public switch for a CPU"
    ),
    ("launch/layout.py", "apply_hardware", "setattr t"): (
        "a hardware preset's values set on this library's own spec (train section), by key"
    ),
    # omegaconf: a null section's schema.
    ("config/load.py", "_not_a_section", "use schema._get_node"): (
        "omegaconf has no public call for a config node (a null section's type and metadata)"
    ),
    ("config/load.py", "_not_a_section", "use sub._is_none"): (
        "omegaconf: whether a node is null without resolving it (OmegaConf.is_none needs a key)"
    ),
    ("config/load.py", "_not_a_section", "use sub._metadata"): (
        "omegaconf: a null node's dataclass type (its object_type) has no public accessor"
    ),
    # transformers: the exported model reads its attention backend as transformers' own models do.
    (
        "export/modeling_hourglass_olmo.py",
        "Attention.forward",
        "use self.config._attn_implementation",
    ): ("transformers' models read the backend chosen at load (attn_implementation=) from it"),
    # torch.
    ("train/run.py", "_set_default_backend", "use pg._set_default_backend"): (
        "torch's init_process_group leaves a cpu:gloo group's default backend unset once a backend "
        "plugin is registered; no public setter"
    ),
    # OLMo-core's budget checkpointing sets the partitioner's budget in torch._functorch.config for
    # the process (its only switch: no public setting) and leaves it; a run puts the value back.
    ("train/run.py", "train", "use torch._functorch"): (
        "OLMo-core sets the min-cut partitioner's budget there; no public setting holds it"
    ),
    ("train/run.py", "train", "setattr torch._functorch.config.activation_memory_budget"): (
        "put back after a run: OLMo-core's budget checkpointing leaves it set for the process"
    ),
    ("nn/variable_width.py", "VariableWidthTransformer.apply_compile", "use torch._dynamo"): (
        "dynamo's recompile limits (torch._dynamo.config) have no torch.compiler setting"
    ),
    ("train/experiment.py", "compile_on_cpu", "setattr model"): (
        "one model's apply_fsdp/apply_ddp/init_weights compile it first on CPU, where OLMo-core's "
        "parallelize_model skips compile; public methods, patched on the one instance"
    ),
    # OLMo-core: extension points it leaves private.
    ("nn/lm_loss.py", "logits_in_eval.by_mode", "use module._loss_implementation"): (
        "OLMo-core's LMHead fixes its loss at build (fused: no logits); its evaluators need logits"
    ),
    ("nn/moe.py", "count_experts_first.counted_train_batch", "use train_module._prepare_batch"): (
        "the global-batch load balance routes the step's micro-batches first, "
        "as OLMo-core's train_batch prepares them"
    ),
    ("nn/moe.py", "count_experts_first.counted_train_batch", "use train_module._set_model_mode"): (
        "the routing pass runs in the train module's own mode handling "
        "(OLMo-core has no public setter)"
    ),
    ("nn/moe.py", "PortableDroplessMoE", "override _init_parallel_mlp"): (
        "OLMo-core's DroplessMoE builds its experts there and nowhere else (no expert config)"
    ),
    ("nn/hourglass_moe.py", "HourglassMoE", "override _init_parallel_mlp"): (
        "OLMo-core's DroplessMoE builds its experts there and nowhere else (no expert config)"
    ),
    ("nn/hourglass_moe.py", "HourglassExperts", "override _shard_experts"): (
        "expert parallelism of the (E, K, ...) hourglass weights; OLMo-core's shards (E, ...) ones"
    ),
    ("eval/evaluators.py", "DownstreamTaskEvaluator", "override _build_data_loader"): (
        "OLMo-core's downstream evaluator builds its loader there: tasks cut to the sequence length"
    ),
    ("train/callbacks/wandb.py", "OfflineAwareWandBCallback", "override _run_path"): (
        "OLMo-core's WandBCallback: the run's path, set where its pre_train would (resumed run id)"
    ),
    ("train/callbacks/wandb.py", "OfflineAwareWandBCallback", "override _finalized"): (
        "OLMo-core's WandBCallback: finalize() without quiet= (wandb >= 0.29) marks it done"
    ),
    (
        "train/callbacks/checkpointer.py",
        "ResumeCheckpointerCallback",
        "override _latest_checkpoint_step",
    ): ("OLMo-core's CheckpointerCallback: the step of a checkpoint the run loaded (no setter)"),
    (
        "train/callbacks/checkpointer.py",
        "ResumeCheckpointerCallback",
        "override _latest_checkpoint_path",
    ): ("OLMo-core's CheckpointerCallback: the path of a checkpoint the run loaded (no setter)"),
    (
        "train/callbacks/checkpointer.py",
        "ResumeCheckpointerCallback",
        "override _save_checkpoint",
    ): (
        "a save checked for non-finite values first, out of space turned into one line; OLMo-core "
        "has no pre-save hook nor a hook for a failed save"
    ),
    (
        "train/callbacks/checkpointer.py",
        "ResumeCheckpointerCallback._save_checkpoint",
        "use super()._save_checkpoint",
    ): ("the override above calls OLMo-core's own save"),
    (
        "train/callbacks/checkpointer.py",
        "ResumeCheckpointerCallback",
        "override _schedule_for_removal",
    ): ("keep ephemeral_keep ephemeral checkpoints; OLMo-core keeps exactly one"),
    (
        "train/callbacks/checkpointer.py",
        "ResumeCheckpointerCallback._schedule_for_removal",
        "use super()._schedule_for_removal",
    ): "the override above hands OLMo-core the checkpoints to remove",
    (
        "train/callbacks/nonfinite.py",
        "NonFiniteGuardCallback.post_train_batch",
        "use self.trainer._metrics",
    ): (
        "OLMo-core's Trainer: the step's loss and grad norm tensors before they are reduced and "
        "logged; no public accessor"
    ),
}


class _Finder(ast.NodeVisitor):
    """Private uses and patches in one module, each with its enclosing function or class."""

    def __init__(self, imported: set):
        self.scope: list = []
        self.found: set = set()
        self.defined: dict = {}  # class qualname -> private names it defines or assigns on self
        self.imported = imported

    def _add(self, what: str) -> None:
        self.found.add((".".join(self.scope), what))

    def _scoped(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _scoped

    def visit_ClassDef(self, node):
        """The private names a class's body defines: methods, class attributes, fields."""
        names = set()
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(item.name)
            targets = (
                item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
            )
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        qualname = ".".join([*self.scope, node.name])
        self.defined[qualname] = {n for n in names if _private(n)}
        self._scoped(node)

    def visit_Attribute(self, node):
        private = _private(node.attr)
        text = ast.unparse(node)
        owner = node.value
        if private and isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            if isinstance(node.ctx, ast.Store):
                self.defined.setdefault(".".join(self.scope[:-1]), set()).add(node.attr)
        elif private and text not in PUBLIC:
            self._add(f"use {text}")
        root = owner
        while isinstance(root, ast.Attribute):
            root = root.value
        if (
            isinstance(node.ctx, ast.Store)
            and isinstance(root, ast.Name)
            and root.id in self.imported
        ):
            self._add(f"setattr {text}")
        self.generic_visit(node)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            self._add(f"setattr {ast.unparse(node.args[0])}")
        self.generic_visit(node)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _imported_names(tree) -> set:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _base_has(cls, name: str) -> bool:
    """Whether a torch or OLMo-core base of ``cls`` has ``name`` (attribute or field)."""
    for base in inspect.getmro(cls)[1:]:
        if base.__module__.split(".")[0] not in BASE_LIBRARIES:
            continue
        fields = base.__dict__.get("__dataclass_fields__", {})
        if name in vars(base) or name in fields or name in getattr(base, "__annotations__", {}):
            return True
    return False


def _overrides(module_name: str, defined: dict) -> set:
    """The private names a class of the module defines that a torch or OLMo-core base has."""
    module = importlib.import_module(module_name)
    found = set()
    for qualname, names in defined.items():
        cls = module
        for part in qualname.split("."):
            cls = getattr(cls, part, None)
        if inspect.isclass(cls):
            found |= {(qualname, f"override {n}") for n in names if _base_has(cls, n)}
    return found


@functools.lru_cache(maxsize=None)
def _found() -> dict:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text())
        finder = _Finder(_imported_names(tree))
        finder.visit(tree)
        places = set(finder.found)
        if any(finder.defined.values()):
            module = "olmo_patches." + rel[: -len(".py")].replace("/", ".").replace(".__init__", "")
            places |= _overrides(module, finder.defined)
        for scope, what in places:
            found[(rel, scope, what)] = path
    return found


def test_every_private_attribute_used_or_patched_is_listed_with_its_reason():
    found = _found()
    unlisted = sorted(set(found) - set(LISTED))
    gone = sorted(set(LISTED) - set(found))
    assert not unlisted, f"private attributes used or patched, not listed with a reason: {unlisted}"
    assert not gone, f"listed, no longer in the library: {gone}"


def test_torchs_lost_worker_handling_is_not_patched():
    """torchrun's agent is used as documented: its monitor of the workers is not replaced."""
    assert not any("_monitor_workers" in what for _, _, what in _found())
    assert not any("_monitor_workers" in what for _, _, what in LISTED)
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    assert "_monitor_workers" not in source and "LocalElasticAgent" not in source


def test_the_finder_sees_a_patch():
    """The scan itself: a module that replaces torch's methods is caught."""
    source = (
        "import torch\n"
        "from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent\n"
        "def hook():\n"
        "    LocalElasticAgent._monitor_workers = lambda self, g: None\n"
        "    torch.nn.Module._apply = None\n"
    )
    tree = ast.parse(source)
    finder = _Finder(_imported_names(tree))
    finder.visit(tree)
    assert ("hook", "use LocalElasticAgent._monitor_workers") in finder.found
    assert ("hook", "setattr LocalElasticAgent._monitor_workers") in finder.found
    assert ("hook", "setattr torch.nn.Module._apply") in finder.found
