"""unflatten: the exported program as the original module tree (torch.export.unflatten as the
oracle for the structure), running like eager, state at the original FQNs, and submodules with
a preserved call signature that can be swapped for another module. (Its fresh-process run
is in test_draft_export.py, with draft_export's.)"""

import pytest
import torch
from corpus import real_models

import exportir
from exportir.export import export, unflatten


class Sub(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("b", torch.ones(4))

    def forward(self, x, scale=None):
        y = self.lin(x) + self.b
        return y * scale if scale is not None else y


class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("n", torch.zeros(4))

    def forward(self, x):
        self.n.add_(1)
        return x + self.n


class Top(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = Sub()
        self.layer2 = Sub()
        self.layer3 = Sub()
        self.count = Counting()
        self.blocks = torch.nn.ModuleList([Sub(), Sub()])

    def forward(self, x):
        y = self.layer1(x, scale=x.sigmoid())
        y = self.layer3(self.layer3(y))  # one module called twice
        for block in self.blocks:
            y = block(y)
        return {"out": self.layer2(y).relu(), "count": self.count(y)}


def _names(module, what="named_parameters"):
    return [n for n, _ in getattr(module, what)()]


def test_tree_state_and_results_match_the_model():
    torch.manual_seed(0)
    model, x = Top(), torch.randn(3, 4)
    reference = Top()
    reference.load_state_dict(model.state_dict())
    ep = export(model, (x,))
    flat = unflatten(ep)
    assert isinstance(flat, exportir.export.UnflattenedModule)
    assert _names(flat) == _names(model)
    assert _names(flat, "named_buffers") == _names(model, "named_buffers")
    assert _names(flat, "named_modules") == _names(torch.export.unflatten(
        torch.export.export(Top(), (x,))), "named_modules")
    # each module has its own graph; the twice-called one is one module, called twice
    assert [n.target for n in flat.graph.nodes if n.op == "call_module"] == [
        "layer1", "layer3", "layer3", "blocks.0", "blocks.1", "layer2", "count"]
    assert [n.op for n in flat.layer1.graph.nodes].count("call_module") == 1
    for _ in range(2):  # the buffer update happens in the module that owns it
        out, expected = flat(x), reference(x)
        torch.testing.assert_close(out, expected)
    torch.testing.assert_close(flat.count.n, reference.count.n)


class Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = Sub()
        self.layer2 = Sub()

    def forward(self, x):
        return self.layer2(self.layer1(x, scale=x.sigmoid())).relu()


def test_a_preserved_submodule_can_be_swapped():
    torch.manual_seed(0)
    model, x = Pair(), torch.randn(3, 4)
    ep = export(model, (x,), preserve_module_call_signature=("layer1",))
    flat = unflatten(ep)
    torch.testing.assert_close(flat(x), model(x))
    # layer1 takes the original call, (x, scale=...), and returns a tensor: any module with
    # that signature fits, here a freshly initialized one
    swapped = Sub()
    flat.layer1 = swapped
    model.layer1 = swapped
    torch.testing.assert_close(flat(x), model(x))
    assert next(n for n in flat.graph.nodes if n.op == "call_module").kwargs.keys() == {"scale"}

    class Bad(torch.nn.Module):
        def forward(self, x, scale=None):
            return (x, x)

    flat.layer1 = Bad()
    with pytest.raises(ValueError, match="preserved call signature got or returned"):
        flat(x)


@pytest.mark.parametrize("name", [
    pytest.param("timm_resnet18", marks=pytest.mark.slow),
    pytest.param("bert", marks=pytest.mark.slow),
    "gpt2",
])
def test_real_models_unflatten_like_torch(name):
    case = real_models.build(name)
    ep = export(case.model, (), case.kwargs)
    flat = unflatten(ep)
    assert _names(flat) == _names(case.model)
    theirs = torch.export.unflatten(torch.export.export(case.model, (), case.kwargs, strict=False))
    assert _names(flat, "named_modules") == _names(theirs, "named_modules")
    fresh = case.inputs(real_models.BATCH, real_models.SEQ, 3)  # same sizes, new values
    with torch.no_grad():
        expected = torch.utils._pytree.tree_leaves(case.model(**fresh))
        got = torch.utils._pytree.tree_leaves(flat(**fresh))
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_bad_arguments():
    with pytest.raises(TypeError, match="expects an ExportedProgram"):
        unflatten(torch.nn.Linear(2, 2))
    ep = export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    with pytest.raises(NotImplementedError, match="flat_args_adapter"):
        unflatten(ep, flat_args_adapter=object())


class Reshape(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).reshape(x.shape[0], 2, 2).sum(-1)


class Branch(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))


class Dynamic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = Reshape()
        self.c = Branch()

    def forward(self, x):
        return self.c(self.layer1(x)) * x.shape[0]


@pytest.mark.parametrize("preserve", [(), ("layer1",), ("c",)])
def test_dynamic_sizes_and_cond_inside_modules(preserve):
    """A preserved module computes its sizes from its own inputs and holds its cond branches."""
    model = Dynamic()
    ep = export(model, (torch.randn(3, 4),), dynamic_shapes={"x": {0: exportir.Dim("b")}},
                preserve_module_call_signature=preserve)
    flat = unflatten(ep)
    for n in (5, 2):
        x = torch.randn(n, 4)
        torch.testing.assert_close(flat(x), model(x))
    with pytest.raises(RuntimeError, match="to be equal to 4, but got 3"):  # as ep.module()
        flat(torch.randn(5, 3))
