"""Every code example of seed 003 (the torch.fx documentation), run against exportir.fx.

Each test follows one example of the seed, in order, and asserts what the seed shows. Where
torch 2.13's real output differs from the text in the doc (the doc predates some changes: node
names no longer get a ``_1`` suffix, codegen puts two spaces before ``;``), the test asserts
torch 2.13's actual output and says so in a comment. Examples that need torchvision use the
local ``TinyResNet`` from the corpus.
"""

import importlib
import math
import re
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import import_ours_fx, torch_code_as_ours
from corpus import fx_seed_wrapped
from corpus.fx_models import TinyResNet
from torch import nn

fx = import_ours_fx()
symbolic_trace = fx.symbolic_trace


def code_of(text: str) -> str:
    """A dedented expected-text literal without its first newline."""
    return textwrap.dedent(text).lstrip("\n")


def gm_code(body: str, head: str = "\n\n\n") -> str:
    """``gm.code`` as FX generates it: a head (blank lines, wrap registrations), the forward
    function, and the trailing indent torch leaves after ``return``."""
    return f"{head}{code_of(body)}    "


def printed_gm(module_repr: str, body: str) -> str:
    """What ``print(gm)`` writes: the module repr, ``gm.code``, then a hint line."""
    return (f"{module_repr}\n{gm_code(body)}\n"
            "# To see more debug info, please use `graph_module.print_readable()`\n")


# --------------------------------------------------------------------------------------------
# Overview


class OverviewModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.param = torch.nn.Parameter(torch.rand(3, 4))
        self.linear = torch.nn.Linear(4, 5)

    def forward(self, x):
        return self.linear(x + self.param).clamp(min=0.0, max=1.0)


def test_overview_graph_and_code(capsys):
    module = OverviewModule()
    symbolic_traced: fx.GraphModule = symbolic_trace(module)
    assert isinstance(symbolic_traced, fx.GraphModule)
    print(symbolic_traced.graph)
    assert capsys.readouterr().out == code_of("""
        graph():
            %x : [num_users=1] = placeholder[target=x]
            %param : [num_users=1] = get_attr[target=param]
            %add : [num_users=1] = call_function[target=operator.add](args = (%x, %param), kwargs = {})
            %linear : [num_users=1] = call_module[target=linear](args = (%add,), kwargs = {})
            %clamp : [num_users=1] = call_method[target=clamp](args = (%linear,), kwargs = {min: 0.0, max: 1.0})
            return clamp
        """)
    # torch 2.13 puts two spaces before ';' (the doc shows one).
    assert symbolic_traced.code == gm_code("""
        def forward(self, x):
            param = self.param
            add = x + param;  x = param = None
            linear = self.linear(add);  add = None
            clamp = linear.clamp(min = 0.0, max = 1.0);  linear = None
            return clamp
        """)
    x = torch.randn(3, 4)
    torch.testing.assert_close(symbolic_traced(x), module(x))


# --------------------------------------------------------------------------------------------
# Writing transformations


def test_transform_skeleton_returns_module():
    def transform(m: nn.Module, tracer_class: type = fx.Tracer) -> torch.nn.Module:
        graph: fx.Graph = tracer_class().trace(m)
        assert isinstance(graph, fx.Graph)
        return fx.GraphModule(m, graph)

    m = OverviewModule()
    out = transform(m)
    assert isinstance(out, torch.nn.Module) and isinstance(out, fx.GraphModule)
    x = torch.randn(3, 4)
    torch.testing.assert_close(out(x), m(x))


def test_transform_in_place_with_recompile():
    def transform(m: nn.Module) -> nn.Module:
        gm: fx.GraphModule = fx.symbolic_trace(m)
        for node in gm.graph.nodes:
            if node.op == "call_method" and node.target == "clamp":
                node.kwargs = {"min": 0.0, "max": 0.5}
        gm.recompile()
        return gm

    m = OverviewModule()
    gm = transform(m)
    assert "clamp = linear.clamp(min = 0.0, max = 0.5)" in gm.code
    x = torch.randn(3, 4)
    torch.testing.assert_close(gm(x), m(x).clamp(max=0.5))


class TopkModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.param = torch.nn.Parameter(torch.rand(3, 4))
        self.linear = torch.nn.Linear(4, 5)

    def forward(self, x):
        return torch.topk(torch.sum(self.linear(x + self.linear.weight).relu(), dim=-1), 3)


def test_primer_print_tabular(capsys):
    gm = fx.symbolic_trace(TopkModule())
    gm.graph.print_tabular()
    out = re.sub(r"0x[0-9a-f]+", "0xADDR", capsys.readouterr().out)
    # torch 2.13 names nodes add/linear/relu/topk (the doc shows add_1, linear_1, ...).
    assert out == code_of("""
        opcode         name           target                                                   args                kwargs
        -------------  -------------  -------------------------------------------------------  ------------------  -----------
        placeholder    x              x                                                        ()                  {}
        get_attr       linear_weight  linear.weight                                            ()                  {}
        call_function  add            <built-in function add>                                  (x, linear_weight)  {}
        call_module    linear         linear                                                   (add,)              {}
        call_method    relu           relu                                                     (linear,)           {}
        call_function  sum_1          <built-in method sum of type object at 0xADDR>   (relu,)             {'dim': -1}
        call_function  topk           <built-in method topk of type object at 0xADDR>  (sum_1, 3)          {}
        output         output         output                                                   (topk,)             {}
        """)


class AddModule(torch.nn.Module):
    def forward(self, x, y):
        return torch.add(x, y)


def test_direct_graph_manipulation_add_to_mul():
    def transform(m: torch.nn.Module, tracer_class: type = fx.Tracer) -> torch.nn.Module:
        graph: fx.Graph = tracer_class().trace(m)
        for node in graph.nodes:
            if node.op == "call_function":  # noqa: SIM102  (the seed's code)
                if node.target == torch.add:
                    node.target = torch.mul
        graph.lint()
        return fx.GraphModule(m, graph)

    gm = transform(AddModule())
    # Retargeting keeps the node's name.
    assert gm.code == gm_code("""
        def forward(self, x, y):
            add = torch.mul(x, y);  x = y = None
            return add
        """)
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(gm(x, y), x * y)


def test_inserting_after_and_replace_all_uses_with():
    traced = fx.symbolic_trace(AddModule())
    node = next(n for n in traced.graph.nodes if n.op == "call_function")
    with traced.graph.inserting_after(node):
        new_node = traced.graph.call_function(torch.relu, args=(node,))
        # The seed calls replace_all_uses_with(new_node) as is, which also rewires new_node's
        # own input to itself; delete_user_cb keeps that one use, as a working transform must.
        node.replace_all_uses_with(new_node, delete_user_cb=lambda user: user is not new_node)
    traced.graph.lint()
    traced.recompile()
    assert traced.code == gm_code("""
        def forward(self, x, y):
            add = torch.add(x, y);  x = y = None
            relu = torch.relu(add);  add = None
            return relu
        """)
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(traced(x, y), torch.relu(x + y))


def test_replace_all_uses_with_as_written_in_seed():
    """The seed's snippet without delete_user_cb: the new node ends up consuming itself."""
    traced = fx.symbolic_trace(AddModule())
    node = next(n for n in traced.graph.nodes if n.op == "call_function")
    with traced.graph.inserting_after(node):
        new_node = traced.graph.call_function(torch.relu, args=(node,))
    replaced = node.replace_all_uses_with(new_node)
    assert [n.name for n in replaced] == ["output", "relu"]  # torch 2.13's order
    assert new_node.args == (new_node,)
    assert list(node.users) == []


# --------------------------------------------------------------------------------------------
# Proxy / retracing


def relu_decomposition(x):
    return (x > 0) * x


decomposition_rules = {F.relu: relu_decomposition}


def decompose(model: torch.nn.Module, tracer_class: type = fx.Tracer) -> torch.nn.Module:
    graph: fx.Graph = tracer_class().trace(model)
    new_graph = fx.Graph()
    env = {}
    tracer = fx.proxy.GraphAppendingTracer(new_graph)
    for node in graph.nodes:
        if node.op == "call_function" and node.target in decomposition_rules:
            proxy_args = [
                fx.Proxy(env[x.name], tracer) if isinstance(x, fx.Node) else x for x in node.args
            ]
            output_proxy = decomposition_rules[node.target](*proxy_args)
            new_node = output_proxy.node
            env[node.name] = new_node
        else:
            new_node = new_graph.node_copy(node, lambda x: env[x.name])
            env[node.name] = new_node
    return fx.GraphModule(model, new_graph)


class ReluNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return F.relu(self.lin(x)) + 1


def test_proxy_retracing_decompose():
    m = ReluNet()
    gm = decompose(m)
    assert gm.code == gm_code("""
        def forward(self, x):
            lin = self.lin(x);  x = None
            gt = lin > 0
            mul = gt * lin;  gt = lin = None
            add = mul + 1;  mul = None
            return add
        """)
    x = torch.randn(3, 4)
    torch.testing.assert_close(gm(x), m(x))


# --------------------------------------------------------------------------------------------
# The interpreter pattern


class ShapeProp:
    """The seed's hand-written shape propagation interpreter."""

    def __init__(self, mod):
        self.mod = mod
        self.graph = mod.graph
        self.modules = dict(self.mod.named_modules())

    def propagate(self, *args):
        args_iter = iter(args)
        env = {}

        def load_arg(a):
            return fx.graph.map_arg(a, lambda n: env[n.name])

        def fetch_attr(target: str):
            target_atoms = target.split(".")
            attr_itr = self.mod
            for i, atom in enumerate(target_atoms):
                if not hasattr(attr_itr, atom):
                    raise RuntimeError(
                        f"Node referenced nonexistant target {'.'.join(target_atoms[:i])}"
                    )
                attr_itr = getattr(attr_itr, atom)
            return attr_itr

        for node in self.graph.nodes:
            if node.op == "placeholder":
                result = next(args_iter)
            elif node.op == "get_attr":
                result = fetch_attr(node.target)
            elif node.op == "call_function":
                result = node.target(*load_arg(node.args), **load_arg(node.kwargs))
            elif node.op == "call_method":
                self_obj, *args = load_arg(node.args)
                kwargs = load_arg(node.kwargs)
                result = getattr(self_obj, node.target)(*args, **kwargs)
            elif node.op == "call_module":
                result = self.modules[node.target](*load_arg(node.args), **load_arg(node.kwargs))
            if isinstance(result, torch.Tensor):
                node.shape = result.shape
                node.dtype = result.dtype
            env[node.name] = result
        return load_arg(self.graph.result)


def test_interpreter_pattern_shape_prop():
    gm = fx.symbolic_trace(OverviewModule())
    prop = ShapeProp(gm)
    # The seed's last line reads ``self.graph.result``, which Graph does not have (in torch 2.13
    # either): everything before it runs, then AttributeError.
    with pytest.raises(AttributeError, match="result"):
        prop.propagate(torch.randn(3, 4))
    shapes = {n.name: tuple(n.shape) for n in gm.graph.nodes if hasattr(n, "shape")}
    # The output node matches no branch, so it records the stale `result` of `clamp`.
    assert shapes == {"x": (3, 4), "param": (3, 4), "add": (3, 4), "linear": (3, 5),
                      "clamp": (3, 5), "output": (3, 5)}
    assert all(n.dtype == torch.float32 for n in gm.graph.nodes if hasattr(n, "dtype"))


# --------------------------------------------------------------------------------------------
# Debugging


def test_checking_correctness_of_modules():
    def transform(m: torch.nn.Module) -> torch.nn.Module:
        gm = fx.symbolic_trace(m)
        gm.recompile()
        return gm

    resnet18 = TinyResNet().eval()  # local stand-in for torchvision's resnet18
    transformed_resnet18 = transform(resnet18)
    input_image = torch.randn(5, 3, 32, 32)
    with pytest.raises(RuntimeError,
                       match="Boolean value of Tensor with more than one value is ambiguous"):
        assert resnet18(input_image) == transformed_resnet18(input_image)
    assert torch.allclose(resnet18(input_image), transformed_resnet18(input_image))


def test_debugging_with_my_pass():
    def my_pass(inp: torch.nn.Module, tracer_class: type = fx.Tracer) -> torch.nn.Module:
        graph = tracer_class().trace(inp)
        return fx.GraphModule(inp, graph)

    my_module = TinyResNet().eval()
    my_module_transformed = my_pass(my_module)
    input_value = torch.randn(2, 3, 16, 16)
    # (the seed drops into pdb here; we only run the module)
    torch.testing.assert_close(my_module_transformed(input_value), my_module(input_value))


class AttrPlusInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.x = torch.nn.Parameter(torch.randn(3))

    def forward(self, y):
        return self.x + y


def test_print_the_generated_code(capsys):
    traced = fx.symbolic_trace(AttrPlusInput())
    print(traced)
    # torch 2.13: `print(gm)` shows the module repr, then the code, then a hint line; the add
    # node is named `add` (the doc shows add_1).
    assert capsys.readouterr().out == printed_gm("AttrPlusInput()", """
        def forward(self, y):
            x = self.x
            add = x + y;  x = y = None
            return add
        """)

    class SubclassM(AttrPlusInput):
        def __init__(self):
            super().__init__()

        def forward(self, y):
            x = self.x
            add_1 = x + y
            x = y = None
            return add_1

    pre_trace = AttrPlusInput()
    post_trace = SubclassM()
    post_trace.load_state_dict(pre_trace.state_dict())
    y = torch.randn(3)
    torch.testing.assert_close(post_trace(y), pre_trace(y))
    torch.testing.assert_close(fx.symbolic_trace(pre_trace)(y), pre_trace(y))


def test_to_folder(tmp_path, monkeypatch):
    m = fx.symbolic_trace(AttrPlusInput())
    folder = tmp_path / "foo"
    m.to_folder(folder, "Bar")
    assert (folder / "module.py").is_file()
    assert (folder / "__init__.py").read_text() == "from .module import *"
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("foo", None)
    try:
        from foo import Bar

        y = Bar()
        inp = torch.randn(3)
        torch.testing.assert_close(y(inp), m(inp))
    finally:
        for key in [k for k in sys.modules if k == "foo" or k.startswith("foo.")]:
            del sys.modules[key]


class PlusModule(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def test_debugging_the_transformation_prints(capsys):
    m = PlusModule()
    traced = symbolic_trace(m)
    print(traced)
    assert capsys.readouterr().out == printed_gm("PlusModule()", """
        def forward(self, x, y):
            add = x + y;  x = y = None
            return add
        """)
    print(traced.graph)
    assert capsys.readouterr().out == code_of("""
        graph():
            %x : [num_users=1] = placeholder[target=x]
            %y : [num_users=1] = placeholder[target=y]
            %add : [num_users=1] = call_function[target=operator.add](args = (%x, %y), kwargs = {})
            return add
        """)
    traced.graph.print_tabular()
    assert capsys.readouterr().out == code_of("""
        opcode         name    target                   args    kwargs
        -------------  ------  -----------------------  ------  --------
        placeholder    x       x                        ()      {}
        placeholder    y       y                        ()      {}
        call_function  add     <built-in function add>  (x, y)  {}
        output         output  output                   (add,)  {}
        """)

    def transform_graph(module: torch.nn.Module, tracer_class: type = fx.Tracer) -> torch.nn.Module:
        g = tracer_class().trace(module)
        return fx.GraphModule(module, g)

    transformed = transform_graph(traced)
    print(transformed)
    assert capsys.readouterr().out == printed_gm("GraphModule()", """
        def forward(self, x, y):
            add = x + y;  x = y = None
            return add
        """)


# --------------------------------------------------------------------------------------------
# Limitations of symbolic tracing


def func_to_trace(x):
    if x.sum() > 0:
        return torch.relu(x)
    else:
        return torch.neg(x)


def test_dynamic_control_flow_fails():
    with pytest.raises(fx.proxy.TraceError) as info:
        fx.symbolic_trace(func_to_trace)
    assert str(info.value) == "symbolically traced variables cannot be used as inputs to control flow"


class StaticControlFlow(torch.nn.Module):
    def __init__(self, do_activation: bool = False):
        super().__init__()
        self.do_activation = do_activation
        self.linear = torch.nn.Linear(512, 512)

    def forward(self, x):
        x = self.linear(x)
        if self.do_activation:
            x = torch.relu(x)
        return x


def test_static_control_flow():
    without_activation = StaticControlFlow(do_activation=False)
    with_activation = StaticControlFlow(do_activation=True)
    traced_without_activation = fx.symbolic_trace(without_activation)
    # torch 2.13 names nodes linear/relu (doc: linear_1/relu_1) and has no `import torch` here.
    assert traced_without_activation.code == gm_code("""
        def forward(self, x):
            linear = self.linear(x);  x = None
            return linear
        """)
    traced_with_activation = fx.symbolic_trace(with_activation)
    assert traced_with_activation.code == gm_code("""
        def forward(self, x):
            linear = self.linear(x);  x = None
            relu = torch.relu(linear);  linear = None
            return relu
        """)


def f_flag(x, flag):
    if flag:
        return x
    else:
        return x * 2


def test_concrete_args_remove_control_flow():
    with pytest.raises(fx.proxy.TraceError):
        fx.symbolic_trace(f_flag)  # Fails!
    gm = fx.symbolic_trace(f_flag, concrete_args={"flag": True})
    x = torch.randn(3)
    torch.testing.assert_close(gm(x, True), x)


def test_non_torch_functions_len_and_wrap():
    with pytest.raises(RuntimeError) as info:
        fx.symbolic_trace(lambda x: x / math.sqrt(len(x)))
    assert str(info.value) == (
        "'len' is not supported in symbolic tracing by default. If you want this call to be "
        "recorded, please call torch.fx.wrap('len') at module scope"
    )
    # corpus.fx_seed_wrapped holds the seed's `normalize` with wrap('len') / wrap('sqrt') at
    # its module scope.
    normalize = fx_seed_wrapped.normalize
    normalize(torch.rand(3, 4))
    traced = fx.symbolic_trace(normalize)
    # torch 2.13 emits the wraps as `torch.fx._symbolic_trace.wrap(...)` lines; exportir.fx
    # spells them `exportir.fx.wrap(...)` (see conftest.torch_code_as_ours). Both call the
    # global `math_sqrt` (the doc shows `import math` / `math.sqrt`).
    assert traced.code == gm_code("""
        def forward(self, x):
            len_1 = len(x)
            sqrt = math_sqrt(len_1);  len_1 = None
            truediv = x / sqrt;  x = sqrt = None
            return truediv
        """, head=torch_code_as_ours('\ntorch.fx._symbolic_trace.wrap("len")\n'
                                     'torch.fx._symbolic_trace.wrap("math_sqrt")\n\n'))
    x = torch.rand(3, 4)
    torch.testing.assert_close(traced(x), x / math.sqrt(3))


class MyCustomTracer(fx.Tracer):
    pass


class ReluPlusOnes(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) + torch.ones(3, 4)


def test_custom_tracer_subclass():
    mod = ReluPlusOnes()
    traced_graph = MyCustomTracer().trace(mod)
    assert isinstance(traced_graph, fx.Graph)
    traced = fx.GraphModule(mod, traced_graph)
    x = torch.randn(3, 4)
    torch.testing.assert_close(traced(x), mod(x))
    # torch.ones(3, 4) is evaluated while tracing and embedded as a tensor constant.
    assert [n.op for n in traced.graph.nodes] == [
        "placeholder", "call_function", "get_attr", "call_function", "output"]
    assert torch.equal(traced._tensor_constant0, torch.ones(3, 4))


class MySpecialSubmodule(torch.nn.Module):
    def forward(self, x):
        return torch.neg(x)


class LeafModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 4)
        self.submod = MySpecialSubmodule()

    def forward(self, x):
        return self.submod(self.linear(x))


def test_leaf_modules_default():
    traced = fx.symbolic_trace(LeafModule())
    # torch 2.13 names: linear / neg (doc: linear_1 / neg_1).
    assert traced.code == gm_code("""
        def forward(self, x):
            linear = self.linear(x);  x = None
            neg = torch.neg(linear);  linear = None
            return neg
        """)


def test_leaf_modules_customized_by_is_leaf_module():
    class LeafTracer(fx.Tracer):
        def is_leaf_module(self, m, module_qualified_name):
            return isinstance(m, MySpecialSubmodule) or super().is_leaf_module(
                m, module_qualified_name)

    root = LeafModule()
    traced = fx.GraphModule(root, LeafTracer().trace(root))
    assert traced.code == gm_code("""
        def forward(self, x):
            linear = self.linear(x);  x = None
            submod = self.submod(linear);  linear = None
            return submod
        """)


@fx.wrap
def torch_randn(x, shape):
    return torch.randn(shape)


def f_randn(x):
    return x + torch_randn(x, 5)


def test_tensor_constructors_wrapped():
    gm = fx.symbolic_trace(f_randn)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert node.target is torch_randn
    assert node.args[1] == 5
    # A fresh random value per call: the wrapped constructor is not baked into the trace.
    x = torch.zeros(5)
    torch.manual_seed(0)
    first = gm(x)
    torch.manual_seed(0)
    torch.testing.assert_close(first, f_randn(x))
    assert not torch.equal(gm(x), gm(x))


def test_type_annotations_preserved():
    def func(x: torch.Tensor, y: int) -> torch.Tensor:
        return x * y

    gm = fx.symbolic_trace(func)
    assert gm.code == gm_code("""
        def forward(self, x : torch.Tensor, y : int) -> torch.Tensor:
            mul = x * y;  x = y = None
            return mul
        """)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert [n.type for n in placeholders] == [torch.Tensor, int]


class DropoutRepro(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.dropout(x, training=self.training)


class DropoutRepro2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout()

    def forward(self, x):
        return self.drop(x)


def test_training_flag_gotcha_functional():
    traced = fx.symbolic_trace(DropoutRepro())
    assert traced.code == gm_code("""
        def forward(self, x):
            dropout = torch.nn.functional.dropout(x, p = 0.5, training = True, inplace = False);  x = None
            return dropout
        """)
    traced.eval()
    x = torch.randn(5, 3)
    with pytest.raises(AssertionError, match="Tensor-likes are not close!"):
        torch.testing.assert_close(traced(x), x)


def test_training_flag_gotcha_module():
    traced = fx.symbolic_trace(DropoutRepro2())
    assert traced.code == gm_code("""
        def forward(self, x):
            drop = self.drop(x);  x = None
            return drop
        """)
    traced.eval()
    x = torch.randn(5, 3)
    torch.testing.assert_close(traced(x), x)


# --------------------------------------------------------------------------------------------
# API reference: symbolic_trace, wrap


def test_symbolic_trace_concrete_args_bool():
    def f(a, b):
        if b == True:
            return a
        else:
            return a * 2

    f = fx.symbolic_trace(f, concrete_args={"b": False})
    assert f(3, False) == 6


def test_symbolic_trace_concrete_args_ph():
    def f(x):
        out = 0
        for v in x.values():
            out += v
        return out

    f = fx.symbolic_trace(f, concrete_args={"x": {"a": fx.PH, "b": fx.PH, "c": fx.PH}})
    assert f({"a": 1, "b": 2, "c": 4}) == 7


def my_custom_function(x, y):
    return x * x + y * y


fx.wrap("my_custom_function")


def fn_to_be_traced(x, y):
    return my_custom_function(x, y)


@fx.wrap
def my_decorated_function(x, y):
    return x * x + y * y


def test_wrap_by_name_and_decorator():
    gm = fx.symbolic_trace(fn_to_be_traced)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls] == [my_custom_function]
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(gm(x, y), x * x + y * y)

    gm2 = fx.symbolic_trace(lambda x, y: my_decorated_function(x, y) + 1)
    calls = [n for n in gm2.graph.nodes if n.op == "call_function"]
    assert calls[0].target is my_decorated_function
    torch.testing.assert_close(gm2(x, y), x * x + y * y + 1)


def test_wrap_must_be_called_at_module_scope():
    with pytest.raises(NotImplementedError, match="wrap must be called at the top level of a module"):
        fx.wrap("my_custom_function")


# --------------------------------------------------------------------------------------------
# API reference: GraphModule


def test_graph_module_graph_reassignment_regenerates_code():
    gm = fx.symbolic_trace(PlusModule())
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    g.output(g.call_function(torch.sub, (x, y)))
    gm.graph = g
    assert gm.graph is g
    assert "sub = torch.sub(x, y)" in gm.code
    a, b = torch.randn(2), torch.randn(2)
    torch.testing.assert_close(gm(a, b), a - b)


def test_graph_module_submodule_editing():
    root = nn.Module()
    root.used = nn.Linear(3, 3)
    root.unused = nn.ReLU()
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_module("used", (x,)))
    gm = fx.GraphModule(root, g, class_name="Edited")
    assert type(gm).__name__ == "Edited"
    assert [n for n, _ in gm.named_children()] == ["used"]  # only referenced targets are copied
    assert gm.add_submodule("a.b.c", nn.Tanh()) is True
    assert isinstance(gm.a.b.c, nn.Tanh)
    assert gm.delete_submodule("a.b.c") is True
    assert gm.delete_submodule("does.not.exist") is False
    gm.delete_all_unused_submodules()
    assert [n for n, _ in gm.named_modules()] == ["", "used"]


def test_graph_module_from_dict_root():
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("w")
    g.output(g.call_function(torch.matmul, (x, w)))
    gm = fx.GraphModule({"w": torch.eye(3)}, g)
    inp = torch.randn(2, 3)
    torch.testing.assert_close(gm(inp), inp)


# --------------------------------------------------------------------------------------------
# API reference: Graph


def test_graph_class_example(capsys):
    gm = fx.symbolic_trace(TopkModule())
    print(gm.graph)
    # torch 2.13 prints `graph():` with placeholders as nodes and `get_attr[...]`, and no `_1`
    # suffixes (the doc shows an older `graph(x):` format).
    assert capsys.readouterr().out == code_of("""
        graph():
            %x : [num_users=1] = placeholder[target=x]
            %linear_weight : [num_users=1] = get_attr[target=linear.weight]
            %add : [num_users=1] = call_function[target=operator.add](args = (%x, %linear_weight), kwargs = {})
            %linear : [num_users=1] = call_module[target=linear](args = (%add,), kwargs = {})
            %relu : [num_users=1] = call_method[target=relu](args = (%linear,), kwargs = {})
            %sum_1 : [num_users=1] = call_function[target=torch.sum](args = (%relu,), kwargs = {dim: -1})
            %topk : [num_users=1] = call_function[target=torch.topk](args = (%sum_1, 3), kwargs = {})
            return topk
        """)


class DeadCode(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attr_1 = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        a = x + 1  # noqa: F841  (dead on purpose)
        return x + self.attr_1


def test_eliminate_dead_code():
    gm = fx.symbolic_trace(DeadCode())
    assert "add = x + 1" in gm.code
    assert gm.graph.eliminate_dead_code() is True
    gm.recompile()
    assert gm.code == gm_code("""
        def forward(self, x):
            attr_1 = self.attr_1
            add_1 = x + attr_1;  x = attr_1 = None
            return add_1
        """)
    assert gm.graph.eliminate_dead_code() is False


def test_inserting_before_and_after_restore_insert_point():
    g = fx.Graph()
    x = g.placeholder("x")
    relu = g.call_function(torch.relu, (x,))
    out = g.output(relu)
    with g.inserting_before(relu):
        neg = g.call_function(torch.neg, (x,))
    with g.inserting_after(relu):
        sig = g.call_function(torch.sigmoid, (relu,))
    # The insert point is restored to the graph's default: append at the very end.
    tail = g.call_function(torch.tanh, (x,))
    assert [n.name for n in g.nodes] == ["x", "neg", "relu", "sigmoid", "output", "tanh"]
    assert out.next is tail and out.prev is sig and sig.prev is relu and neg.next is relu
    g.inserting_before(out)  # without `with`: sets the insert point permanently
    g.call_function(torch.abs, (x,))
    assert [n.name for n in g.nodes] == ["x", "neg", "relu", "sigmoid", "abs_1", "output", "tanh"]


def test_node_copy_into_new_graph():
    gm = fx.symbolic_trace(OverviewModule())
    g = gm.graph
    new_graph = fx.Graph()
    value_remap = {}
    for node in g.nodes:
        value_remap[node] = new_graph.node_copy(node, lambda n: value_remap[n])
    assert str(new_graph) == str(g)
    new_gm = fx.GraphModule(gm, new_graph)
    x = torch.randn(3, 4)
    torch.testing.assert_close(new_gm(x), gm(x))


def test_graph_copy_returns_output_value():
    gm = fx.symbolic_trace(PlusModule())
    new_graph = fx.Graph()
    val_map = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            val_map[n] = new_graph.placeholder(n.name)
    out = new_graph.graph_copy(gm.graph, val_map)
    assert out.name == "add" and out.op == "call_function"
    new_graph.output(out)
    assert str(new_graph) == str(gm.graph)


def test_on_generate_code():
    gm = fx.symbolic_trace(PlusModule())

    def insert_pdb(body):
        return ["import pdb; pdb.set_trace()\n", *body]

    gm.graph.on_generate_code(lambda _: insert_pdb)
    gm.recompile()
    assert "import pdb; pdb.set_trace()" in gm.code
    gm.graph.on_generate_code(lambda _: None)
    gm.recompile()
    assert "pdb" not in gm.code
    with gm.graph.on_generate_code(lambda current: insert_pdb):
        gm.recompile()
        assert "import pdb; pdb.set_trace()" in gm.code
    gm.recompile()
    assert "pdb" not in gm.code


def test_node_prepend_and_append():
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.relu, (x,))
    b = g.call_function(torch.neg, (x,))
    g.output((a, b))
    a.prepend(b)  # p -> self  becomes  p -> b -> self
    assert [n.name for n in g.nodes] == ["x", "neg", "relu", "output"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch 2.13 is silent here (its _prepend is in C++)
        b.append(a)  # no-op ordering-wise: a already follows b
        a.prepend(a)
    assert [n.name for n in g.nodes] == ["x", "neg", "relu", "output"]
    a.append(b)
    assert [n.name for n in g.nodes] == ["x", "relu", "neg", "output"]


# --------------------------------------------------------------------------------------------
# API reference: Interpreter, Transformer


def fn_sigmoid_neg(x):
    return torch.sigmoid(x).neg()


def test_interpreter_neg_sigmoid_swap():
    class NegSigmSwapInterpreter(fx.Interpreter):
        def call_function(self, target, args, kwargs):
            if target == torch.sigmoid:
                return torch.neg(*args, **kwargs)
            return super().call_function(n)  # noqa: F821  (the seed's code, never reached)

        def call_method(self, target, args, kwargs):
            if target == "neg":
                call_self, *args_tail = args
                return call_self.sigmoid(*args_tail, **kwargs)
            return super().call_method(n)  # noqa: F821

    gm = fx.symbolic_trace(fn_sigmoid_neg)
    input = torch.randn(3, 4)
    result = NegSigmSwapInterpreter(gm).run(input)
    torch.testing.assert_close(result, torch.neg(input).sigmoid())


def test_transformer_neg_sigmoid_swap():
    class NegSigmSwapXformer(fx.Transformer):
        def call_function(self, target, args, kwargs):
            if target == torch.sigmoid:
                return torch.neg(*args, **kwargs)
            return super().call_function(n)  # noqa: F821

        def call_method(self, target, args, kwargs):
            if target == "neg":
                call_self, *args_tail = args
                return call_self.sigmoid(*args_tail, **kwargs)
            return super().call_method(n)  # noqa: F821

    gm = fx.symbolic_trace(fn_sigmoid_neg)
    transformed: torch.nn.Module = NegSigmSwapXformer(gm).transform()
    assert isinstance(transformed, fx.GraphModule)
    input = torch.randn(3, 4)
    torch.testing.assert_close(transformed(input), torch.neg(input).sigmoid())
    assert transformed.code == gm_code("""
        def forward(self, x):
            neg = torch.neg(x);  x = None
            sigmoid = neg.sigmoid();  neg = None
            return sigmoid
        """)


def test_interpreter_keeps_env_without_garbage_collection():
    gm = fx.symbolic_trace(fn_sigmoid_neg)
    interp = fx.Interpreter(gm, garbage_collect_values=False)
    interp.run(torch.randn(2))
    assert sorted(n.name for n in interp.env) == ["neg", "output", "sigmoid", "x"]


# --------------------------------------------------------------------------------------------
# API reference: replace_pattern


class CatSumMax(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, w1, w2):
        m1 = torch.cat([w1, w2]).sum()
        m2 = torch.cat([w1, w2]).sum()
        return x + torch.max(m1) + torch.max(m2)


def pattern(w1, w2):
    return torch.cat([w1, w2]).sum()


def replacement(w1, w2):
    return torch.stack([w1, w2])


def test_replace_pattern_example():
    subgraph_rewriter = importlib.import_module(fx.__name__ + ".subgraph_rewriter")
    traced_module = symbolic_trace(CatSumMax())
    matches = subgraph_rewriter.replace_pattern(traced_module, pattern, replacement)
    assert len(matches) == 2
    assert all(isinstance(m, subgraph_rewriter.Match) for m in matches)
    # `anchor` is the pattern's node the match was found from (the pattern's output value).
    assert [m.anchor.name for m in matches] == ["sum_1", "sum_1"]
    # nodes_map: pattern node -> matched node (erased from the graph since), by name.
    assert [{k.name: v.name for k, v in m.nodes_map.items()} for m in matches] == [
        {"sum_1": "sum_1", "cat": "cat", "w1": "w1", "w2": "w2"},
        {"sum_1": "sum_2", "cat": "cat_1", "w1": "w1", "w2": "w2"},
    ]
    # torch 2.13's code (the doc shows stack_1/sum_1/... and a `.sum()` that the replacement
    # graph does not contain).
    assert traced_module.code == gm_code("""
        def forward(self, x, w1, w2):
            stack = torch.stack([w1, w2])
            max_1 = torch.max(stack);  stack = None
            add = x + max_1;  x = max_1 = None
            stack_1 = torch.stack([w1, w2]);  w1 = w2 = None
            max_2 = torch.max(stack_1);  stack_1 = None
            add_1 = add + max_2;  add = max_2 = None
            return add_1
        """)


def test_replace_pattern_replacement_needs_all_pattern_params():
    def pat(x, y):
        return torch.neg(x) + torch.relu(y)

    def rep(x, y):
        return torch.relu(x)

    def f(a, b):
        return torch.neg(a) + torch.relu(b)

    gm = fx.symbolic_trace(f)
    matches = fx.replace_pattern(gm, pat, rep)
    assert len(matches) == 1
    assert gm.code == gm_code("""
        def forward(self, a, b):
            relu_1 = torch.relu(a);  a = None
            return relu_1
        """)
