"""The ``softmax_fused`` target (attnverify/normalizers/_fused.c) against float64 and torch.

Every instruction-set path the CPU has is run (``ATTNVERIFY_FUSED_ISA``), so a machine with
AVX-512 tests the AVX2 and portable paths too. The built-in ``softmax`` is the reference path on
``torch.softmax`` and never runs the kernel.
"""

from __future__ import annotations

import ast
import math
import shutil

import pytest
import torch
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from torch.autograd import forward_ad

from attnverify import settings
from attnverify.cli import main
from attnverify.errors import UsageError
from attnverify.normalizers import dense, fused

BUILT = fused._ext is not None
needs_kernel = pytest.mark.skipif(not BUILT, reason=fused.status())
ISAS = [
    name
    for level, name in fused.ISA_NAMES.items()
    if BUILT and level <= fused._ext.available_isa()
]


def test_extension_is_built_where_a_compiler_exists():
    """`optional = true` in pyproject.toml hides a failed build; this does not."""
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here, so the extension is not expected")
    assert BUILT, fused.status()
    assert fused.status().startswith("fused softmax: on")


def kernel(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    y = fused.softmax_lastdim(x, -1, temperature)
    assert y is not None, "the kernel did not take an eligible input"
    return y


def reference(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    return dense.softmax(x, -1, temperature)


@pytest.fixture
def env(monkeypatch):
    """``env(NAME, value)`` sets a variable for this test; settings are reread either way."""

    def set_(name: str, value: str) -> None:
        monkeypatch.setenv(name, value)
        settings.reload()

    yield set_
    settings.reload()  # the next read comes after monkeypatch has restored the environment


@pytest.fixture(params=ISAS)
def isa(request, env):
    env("ATTNVERIFY_FUSED_ISA", request.param)
    return request.param


def ulps(actual: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|actual − exact| in units of the float32 spacing at ``exact`` (subnormal spacing below)."""
    e = exact.abs().clamp_min(torch.finfo(torch.float32).tiny)
    spacing = torch.exp2(torch.floor(torch.log2(e)) - 23)
    return (actual.double() - exact).abs() / spacing


@needs_kernel
@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 1000, 4096, 4097])
@pytest.mark.parametrize("scale", [1.0, 10.0, 40.0])
def test_matches_float64(isa, n, scale):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(6, n, generator=g) * scale
    y = kernel(x)
    exact = torch.softmax(x.double(), -1)
    assert y.dtype == torch.float32 and y.shape == x.shape
    big = exact > 1e-30
    ours = ((y.double() - exact).abs() / exact)[big].max().item()
    theirs = ((torch.softmax(x, -1).double() - exact).abs() / exact)[big].max().item()
    # as accurate as torch.softmax: both err by (x - max)'s rounding and the sum's; an exp that
    # is off by 1e-5 fails by an order of magnitude
    assert ours <= 1.25 * theirs + 5e-7, (ours, theirs)
    assert ((y[~big].double() - exact[~big]).abs() < 1e-30).all()
    assert torch.allclose(y.sum(-1).double(), torch.ones(6, dtype=torch.float64), atol=2e-6)


@needs_kernel
def test_exp_is_within_one_ulp(isa):
    """With ``[0, a…]`` and every ``a ≤ −30`` the row sum rounds to 1, so ``y = exp(a)`` exactly as
    the kernel's exp computed it: its error is measured directly, down into the subnormals."""
    a = torch.linspace(-103.9, -30.0, 40001, dtype=torch.float64).to(torch.float32)
    x = torch.cat([torch.zeros(1), a]).unsqueeze(0)
    y = kernel(x)[0, 1:]
    exact = torch.exp(a.double())
    normal = exact >= torch.finfo(torch.float32).tiny
    assert ulps(y[normal], exact[normal]).max().item() <= 1.0
    # subnormal results: within one subnormal spacing (2^-149) of exact
    assert ((y[~normal].double() - exact[~normal]).abs() <= 2.0**-149).all()
    assert (y > 0).all()  # exp(-103.9) is the smallest subnormal, not 0


@needs_kernel
def test_masked_keys_get_exactly_zero_and_rows_without_them_are_unchanged(isa):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 37, generator=g)
    mask = torch.rand(4, 37, generator=g) < 0.4
    mask[:, 0] = False
    y = kernel(x.masked_fill(mask, -math.inf))
    assert (y[mask] == 0).all()
    for r in range(4):
        keep = ~mask[r]
        torch.testing.assert_close(y[r, keep], kernel(x[r, keep].unsqueeze(0))[0])


@needs_kernel
def test_fully_masked_rows_give_zeros_next_to_ordinary_rows(isa):
    x = torch.randn(5, 20)
    x[1] = -math.inf
    x[3] = -math.inf
    y = kernel(x)
    assert (y[[1, 3]] == 0).all()
    torch.testing.assert_close(y.sum(-1), torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0]))


@needs_kernel
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_or_inf_rows_take_the_reference_path(isa, bad):
    x = torch.randn(3, 40)
    x[1, 7] = bad
    y = kernel(x)
    torch.testing.assert_close(y, reference(x), equal_nan=True)
    assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2]]).any()


@needs_kernel
def test_huge_logits_stay_finite(isa):
    x = torch.tensor([[1e30, 0.0, -1e30], [3e38, -3e38, 3e38], [-3e38, -3e38, -3e38]])
    y = kernel(x)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, torch.tensor([[1.0, 0, 0], [0.5, 0, 0.5], [1 / 3] * 3]))


@needs_kernel
@pytest.mark.parametrize("temperature", [0.05, 0.7, 3.0, 1e6])
def test_temperature_matches_the_reference_path(isa, temperature):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 300, generator=g) * 4
    y = kernel(x, temperature)
    torch.testing.assert_close(y, reference(x, temperature))
    exact = torch.softmax(x.double() / temperature, -1)
    big = exact > 1e-30
    ours = ((y.double() - exact).abs() / exact)[big].max().item()
    theirs = ((torch.softmax(x / temperature, -1).double() - exact).abs() / exact)[big].max()
    assert ours <= 1.25 * theirs.item() + 5e-7, (ours, theirs)


@needs_kernel
def test_a_temperature_shifts_before_dividing_on_both_paths(isa):
    """``(z − max)/T``, not ``z/T − max/T``: −3e38/0.5 would overflow to −inf (a row that
    looks fully masked), and 1e6/0.3 rounds away the differences that decide the weights."""
    huge = torch.tensor([[-3e38, -2e38]])
    assert torch.equal(kernel(huge, 0.5), torch.tensor([[0.0, 1.0]]))
    assert torch.equal(reference(huge, 0.5), torch.tensor([[0.0, 1.0]]))
    big = torch.tensor([[1e6 + 1, 1e6 + 2, 1e6, 1e6 - 3]])
    exact = torch.softmax((big.double() - 1e6) / 0.3, -1)
    for y in (kernel(big, 0.3), reference(big, 0.3)):
        torch.testing.assert_close(y.double(), exact, rtol=1e-6, atol=0)
    naive = torch.softmax(big / 0.3, -1)  # what dividing first gives: 8% off
    assert ((naive.double() - exact).abs() / exact).max() > 0.05


def test_a_temperature_outside_float32_is_left_to_torch():
    x = torch.randn(2, 5)
    assert fused.softmax_lastdim(x, -1, 1e-300) is None
    y = fused.softmax_fused(x, temperature=1e-300)  # x / T overflows float32 on either path
    torch.testing.assert_close(y, reference(x, 1e-300), equal_nan=True)


@needs_kernel
def test_attention_shapes_and_empty_tensors(isa):
    x = torch.randn(2, 3, 5, 17)
    torch.testing.assert_close(kernel(x), torch.softmax(x, -1))
    assert fused.softmax_lastdim(torch.empty(0, 4), -1, 1.0) is None
    assert fused.softmax_fused(torch.empty(3, 0)).shape == (3, 0)
    v = torch.randn(9)
    torch.testing.assert_close(kernel(v), torch.softmax(v, -1))


@needs_kernel
def test_output_is_new_and_input_untouched():
    x = torch.randn(4, 50)
    before = x.clone()
    y = kernel(x)
    assert y.data_ptr() != x.data_ptr()
    assert torch.equal(x, before)


@needs_kernel
def test_threads_split_rows_without_changing_a_bit():
    x = torch.randn(512, 1024)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(x)
        torch.set_num_threads(2)
        two = kernel(x)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one, two)


class _Spy:
    """Stands in for the extension module and counts kernel calls."""

    def __init__(self, ext):
        self._ext, self.calls = ext, 0

    def softmax_f32(self, *args):
        self.calls += 1
        self.last = args
        return self._ext.softmax_f32(*args)

    def __getattr__(self, name):
        return getattr(self._ext, name)


@pytest.fixture
def spy(monkeypatch):
    s = _Spy(fused._ext)
    monkeypatch.setattr(fused, "_ext", s)
    return s


@needs_kernel
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(4, 8, dtype=torch.float64),
        lambda: torch.randn(4, 8, dtype=torch.float16),
        lambda: torch.randn(8, 4).t(),  # not contiguous
    ],
    ids=["float64", "float16", "transposed"],
)
def test_ineligible_inputs_run_torch_softmax(spy, make):
    x = make()
    y = fused.softmax_fused(x)
    assert spy.calls == 0
    torch.testing.assert_close(y, torch.softmax(x.float(), -1).to(x.dtype))


@needs_kernel
def test_the_forced_instruction_set_reaches_the_kernel(spy, isa):
    fused.softmax_fused(torch.randn(2, 40))
    assert spy.last[-1] == settings.ISA_LEVELS[isa]


@needs_kernel
@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar")
def test_traced_zero_and_tensor_temperature_inputs_run_torch_softmax(spy):
    x = torch.randn(3, 8)
    traced = torch.jit.trace(lambda v: fused.softmax_fused(v), x)  # a C call would not be recorded
    other = torch.randn(3, 8)
    torch.testing.assert_close(traced(other), torch.softmax(other, -1))
    spy.calls = 0  # jit.trace's check_trace reran the function eagerly, on the kernel
    zero = torch._efficientzerotensor((2, 4))  # no memory behind it
    torch.testing.assert_close(fused.softmax_fused(zero), torch.full((2, 4), 0.25))
    a = torch.randn(2, 5, requires_grad=True)
    t = torch.tensor(2.0, requires_grad=True)
    w = torch.arange(5.0)
    (fused.softmax_fused(a, temperature=t) * w).sum().backward()  # T's own gradient survives
    expected = torch.autograd.grad((torch.softmax(a / t, -1) * w).sum(), t)[0]
    torch.testing.assert_close(t.grad, expected)
    assert spy.calls == 0
    p = torch.nn.Parameter(torch.randn(2, 5))
    assert type(fused.softmax_fused(p).grad_fn).__name__ == "_FusedSoftmaxBackward"
    assert spy.calls == 1


@needs_kernel
def test_lazy_negation_runs_torch_softmax(spy):
    x = torch.randn(4, 8)
    neg = torch._neg_view(x)  # data_ptr holds x; the values are -x
    torch.testing.assert_close(fused.softmax_fused(neg), torch.softmax(-x, -1))
    assert spy.calls == 0


@needs_kernel
def test_the_kernel_is_a_torch_operator_that_modes_and_fake_tensors_see(spy):
    """A dispatch mode sees ``attnverify.softmax_fused`` (not a hidden C call); fake tensors get
    their shape from its Meta implementation."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.randn(4, 8)
    with FlopCounterMode(display=False):
        y = fused.softmax_fused(x)
    torch.testing.assert_close(y, torch.softmax(x, -1))
    assert spy.calls == 1
    op = torch.ops.attnverify.softmax_fused.default
    torch.library.opcheck(op, (x, 0.5), test_utils=("test_schema", "test_faketensor"))
    back = torch.ops.attnverify.softmax_fused_backward.default
    torch.library.opcheck(
        back, (torch.randn(4, 8), y, 0.5), test_utils=("test_schema", "test_faketensor")
    )
    assert op(torch.empty(2, 3, device="meta"), 1.0).shape == (2, 3)
    t = torch.randn(8, 4).t()  # called directly on what the kernel cannot read: the torch path
    torch.testing.assert_close(op(t, 1.0), torch.softmax(t, -1))
    assert op(torch.empty(2, 0), 1.0).shape == (2, 0)


@needs_kernel
def test_the_reference_softmax_never_runs_the_kernel(spy):
    x = torch.randn(3, 50)
    for t in (1.0, 0.5):
        torch.testing.assert_close(dense.softmax(x, temperature=t), kernel(x, t))
    spy.calls = 0
    for d in (dense.softmax, dense.ssmax, dense.sa_softmax, dense.dagpam):
        d(x)
        d(x.clone().requires_grad_()).sum().backward()
    assert spy.calls == 0


def test_softmax_fused_is_a_builtin_certified_against_softmax():
    from attnverify.normalizers import BUILTINS, SOFTMAX_CLAIMS

    spec = BUILTINS["softmax_fused"]
    assert spec.reference is dense.softmax and "matches_reference" in spec.claims
    assert set(SOFTMAX_CLAIMS) < set(spec.claims)
    assert spec.kernel is BUILTINS["softmax"].kernel and "_fused.c" in spec.citation


def _private_torch_names(source: str) -> list[str]:
    """``torch.<…>._x`` attributes and ``_x`` names imported from torch, in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            parts = (node.module or "").split(".") + [a.name for a in node.names]
            found += [p for p in parts if p.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            root = node
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in ("torch", "forward_ad", "x", "y"):
                found.append(ast.unparse(node))
    return found


def test_no_private_torch_api():
    assert sorted(
        _private_torch_names(
            "import torch\ntorch._softmax_backward_data(g)\nx._is_zerotensor()\n"
            "torch._C._len_torch_dispatch_stack()\nforward_ad._current_level\n"
        )
    ) == [
        "forward_ad._current_level",
        "torch._C",
        "torch._C._len_torch_dispatch_stack",
        "torch._softmax_backward_data",
        "x._is_zerotensor",
    ]
    assert _private_torch_names(open(fused.__file__, encoding="utf-8").read()) == []


@needs_kernel
def test_torch_compile_traces_torch_softmax_and_the_kernel_adds_no_graph_break():
    x = torch.randn(4, 8)
    explained = torch._dynamo.explain(lambda v: fused.softmax_fused(v) * 2)(x)
    # (the reference path's fully-masked-row check breaks the graph on its own)
    where = [b.user_stack[-1].filename for b in explained.break_reasons if b.user_stack]
    assert not [f for f in where if f.endswith("fused.py")], where
    torch.testing.assert_close(torch.compile(fused.softmax_fused, backend="eager")(x), kernel(x))


@needs_kernel
def test_other_dims_run_torch_softmax(spy):
    x = torch.randn(4, 8)
    torch.testing.assert_close(fused.softmax_fused(x, dim=0), torch.softmax(x, 0))
    assert spy.calls == 0
    fused.softmax_fused(x, dim=1)
    assert spy.calls == 1


@needs_kernel
def test_switched_off_by_the_environment(spy, env):
    env("ATTNVERIFY_FUSED", "0")
    assert not fused.available()
    assert fused.status() == "fused softmax: off, ATTNVERIFY_FUSED=0"
    fused.softmax_fused(torch.randn(3, 4))
    assert spy.calls == 0


@needs_kernel
def test_a_bad_or_missing_instruction_set_is_a_clear_error(env):
    env("ATTNVERIFY_FUSED_ISA", "sse9")
    with pytest.raises(UsageError, match="ATTNVERIFY_FUSED_ISA='sse9' is not one of"):
        fused.softmax_fused(torch.randn(2, 3))
    assert main(["list"]) == 2  # the command line refuses it before running anything
    env("ATTNVERIFY_FUSED_ISA", "avx2")
    env("ATTNVERIFY_FUSED", "maybe")
    with pytest.raises(UsageError, match="ATTNVERIFY_FUSED='maybe'"):
        fused.softmax_fused(torch.randn(2, 3))
    with pytest.raises(ValueError, match="instruction set 4 not available"):
        fused._ext.softmax_f32(0, 0, 1, 1, 1.0, 1, 4)


# ----------------------------------------------------------------------------------- autograd


def _pair(shape=(5, 33), seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    return x.clone().requires_grad_(), x.clone().requires_grad_()


@needs_kernel
@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_gradient_and_second_derivative_match_torch(temperature):
    a, b = _pair()
    ya = fused.softmax_fused(a, temperature=temperature)
    assert type(ya.grad_fn).__name__ == "_FusedSoftmaxBackward"
    yb = torch.softmax(b / temperature, -1)
    g = torch.randn_like(ya)
    (ga,) = torch.autograd.grad(ya, a, g, create_graph=True)
    (gb,) = torch.autograd.grad(yb, b, g, create_graph=True)
    torch.testing.assert_close(ga, gb)
    h = torch.randn_like(ga)
    torch.testing.assert_close(torch.autograd.grad(ga, a, h)[0], torch.autograd.grad(gb, b, h)[0])


@needs_kernel
@pytest.mark.parametrize("temperature", [1.0, 0.3])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 300, 4097])
def test_backward_kernel_matches_torch(temperature, n):
    """Without ``create_graph`` the backward is the C kernel (torch's softmax backward formula);
    an expanded gradient (from ``.sum()``) takes the formula in torch ops instead."""
    a, b = _pair((7, n), seed=n)
    ya = fused.softmax_fused(a, temperature=temperature)
    yb = torch.softmax(b / temperature, -1)
    g = torch.randn(ya.shape, generator=torch.Generator().manual_seed(n + 1))
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fused, "_backward_formula", lambda *args: calls.append(1) or formula(*args))
        (ga,) = torch.autograd.grad(ya, a, g, retain_graph=True)
        assert calls == []
        (gs,) = torch.autograd.grad(ya.sum(), a)  # expanded ones: not contiguous
        assert calls == [1]
    torch.testing.assert_close(ga, torch.autograd.grad(yb, b, g)[0], rtol=2e-5, atol=1e-7)
    torch.testing.assert_close(gs, torch.zeros_like(gs), rtol=0, atol=1e-5)  # Σ y = 1


formula = fused._backward_formula


@needs_kernel
def test_forward_mode_matches_torch():
    x = torch.randn(4, 19)
    t = torch.randn(4, 19)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, t)
        ours = forward_ad.unpack_dual(fused.softmax_fused(dual, temperature=2.0))
        theirs = forward_ad.unpack_dual(torch.softmax(forward_ad.make_dual(x, t) / 2.0, -1))
    torch.testing.assert_close(ours.primal, theirs.primal)
    torch.testing.assert_close(ours.tangent, theirs.tangent)


@needs_kernel
def test_torch_func_transforms_fall_back_and_agree(spy):
    x = torch.randn(6)
    jac = torch.func.jacrev(fused.softmax_fused)(x)
    jvp = torch.func.jvp(fused.softmax_fused, (x,), (torch.ones(6),))[1]
    assert spy.calls == 0
    y = torch.softmax(x, -1)
    torch.testing.assert_close(jac, torch.diag(y) - y.unsqueeze(-1) * y.unsqueeze(-2))
    torch.testing.assert_close(jvp, torch.zeros(6))  # shift invariance


@needs_kernel
def test_in_place_edits_of_the_output_behave_as_with_torch_softmax():
    """The edit itself is allowed (a view returned by a custom Function would refuse it); the
    backward then refuses, because softmax saved its output — exactly as ``torch.softmax``."""
    for fn in (fused.softmax_fused, lambda v: torch.softmax(v, -1)):
        a, _ = _pair()
        y = fn(a)
        y.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


@needs_kernel
def test_kernel_version_matches_the_build():
    assert fused._ext.kernel_version() == fused.KERNEL_VERSION
    assert fused._ext.available_isa() in fused.ISA_NAMES


# ------------------------------------------------------------------ kernel against the reference

_SPECIAL = st.sampled_from([-math.inf, math.inf, math.nan, 0.0, -0.0, 3e38, -3e38, 1e-40])


@st.composite
def _score_rows(draw):
    rows, n = draw(st.integers(1, 4)), draw(st.integers(1, 70))
    scale = draw(st.sampled_from([1.0, 30.0, 1e4, 1e30]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(rows, n, generator=g) * scale
    for _ in range(draw(st.integers(0, 3))):  # a few special values anywhere
        x[draw(st.integers(0, rows - 1)), draw(st.integers(0, n - 1))] = draw(_SPECIAL)
    if draw(st.booleans()):  # mask a random subset, sometimes whole rows
        x = x.masked_fill(torch.rand(rows, n, generator=g) < draw(st.floats(0, 1)), -math.inf)
    return x


@needs_kernel
@given(x=_score_rows(), temperature=st.sampled_from([1.0, 0.01, 0.7, 3.0, 1e5]))
@hyp_settings(max_examples=150, deadline=None, derandomize=True, database=None)
def test_every_path_agrees_with_the_reference(x, temperature):
    expected = reference(x, temperature)
    for name in ISAS:
        settings.reload()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ATTNVERIFY_FUSED_ISA", name)
            y = fused.softmax_fused(x, temperature=temperature)
        settings.reload()
        # both exps are within 1 ulp; sums differ in order: a few float32 ulps apart at most
        torch.testing.assert_close(y, expected, rtol=4e-6, atol=1e-37, equal_nan=True,
                                   msg=lambda m, name=name: f"{name}: {m}")
