"""Conformance of the layout ops with PyTorch, on every kind and dtype.

Covers reshape / view / flatten, squeeze and unsqueeze, permute and its
relatives (swap_dims, transpose, T, movedim), expand, flip, roll, narrow,
split / chunk, repeat, cat / stack, tril / triu and pad. Layout ops only move
elements, so every comparison is exact, floats included (pad's fill value and
tril's zeros are exact too).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, assert_close, each_case, random_pair

from ember import ArgumentError, DType, KindError, ShapeError, Tensor

KIND_DTYPES = [DType.F32, DType.I64, DType.BOOL]  # one dtype per kind: every case runs on these
OTHER_DTYPES = [d for d in ALL_DTYPES if d not in KIND_DTYPES]  # the sweeps add these


def pair(shape, dtype: DType, device, seed: int = 0) -> tuple[Tensor, torch.Tensor]:
    """An ember tensor and its torch twin, with values spread enough to tell elements apart."""
    return random_pair(tuple(shape), dtype, device, low=-100, high=100, seed=seed)


def assert_same(actual: Tensor, expected: torch.Tensor) -> None:
    """Exact equality of shape, dtype and elements."""
    assert_close(actual, expected, rtol=0, atol=0)


def case(name: str, shape, op, ref):
    return pytest.param(tuple(shape), op, ref, id=name)


# (shape, ember op, torch reference). Expected shapes of reshape with 0 entries are
# written out: 0 keeps the current size in ember (ONNX / Burn), it means 0 in torch.
CASES = [
    case("reshape", (2, 3, 4), lambda x: x.reshape([4, 6]), lambda t: t.reshape(4, 6)),
    case("reshape-tuple", (2, 3, 4), lambda x: x.reshape((6, 4)), lambda t: t.reshape(6, 4)),
    case("reshape-minus-one", (2, 3, 4), lambda x: x.reshape([-1]), lambda t: t.reshape(-1)),
    case("reshape-middle-minus-one", (2, 3, 4), lambda x: x.reshape([2, -1, 3]), lambda t: t.reshape(2, 4, 3)),
    case("reshape-zero-keeps", (2, 3, 4), lambda x: x.reshape([0, -1]), lambda t: t.reshape(2, 12)),
    case("reshape-zeros", (2, 3, 4), lambda x: x.reshape([0, 0, 2, 2]), lambda t: t.reshape(2, 3, 2, 2)),
    case("reshape-after-permute", (2, 3, 4), lambda x: x.permute(2, 0, 1).reshape([4, -1]),
         lambda t: t.permute(2, 0, 1).reshape(4, -1)),
    case("reshape-0d-to-1x1", (), lambda x: x.reshape([1, 1]), lambda t: t.reshape(1, 1)),
    case("reshape-to-0d", (1, 1), lambda x: x.reshape([]), lambda t: t.reshape(())),
    case("reshape-empty", (0, 3), lambda x: x.reshape([3, 0]), lambda t: t.reshape(3, 0)),
    case("reshape-empty-minus-one", (2, 0), lambda x: x.reshape([-1, 2]), lambda t: t.reshape(-1, 2)),
    case("view", (2, 3, 4), lambda x: x.view([3, -1]), lambda t: t.reshape(3, -1)),
    case("flatten", (2, 3, 4), lambda x: x.flatten(), lambda t: t.flatten()),
    case("flatten-range", (2, 3, 4, 5), lambda x: x.flatten(1, 2), lambda t: t.flatten(1, 2)),
    case("flatten-negative", (2, 3, 4), lambda x: x.flatten(-2, -1), lambda t: t.flatten(-2, -1)),
    case("flatten-one-dim", (2, 3, 4), lambda x: x.flatten(1, 1), lambda t: t.flatten(1, 1)),
    case("flatten-0d", (), lambda x: x.flatten(), lambda t: t.flatten()),
    case("flatten-empty", (2, 0, 3), lambda x: x.flatten(), lambda t: t.flatten()),
    case("squeeze", (1, 3, 1, 2), lambda x: x.squeeze(), lambda t: t.squeeze()),
    case("squeeze-dim", (1, 3, 1, 2), lambda x: x.squeeze(0), lambda t: t.squeeze(0)),
    case("squeeze-negative-dim", (1, 3, 1, 2), lambda x: x.squeeze(-2), lambda t: t.squeeze(-2)),
    case("squeeze-to-0d", (1, 1), lambda x: x.squeeze(), lambda t: t.squeeze()),
    case("squeeze-0d", (), lambda x: x.squeeze(), lambda t: t.squeeze()),
    case("squeeze-empty", (1, 0, 1), lambda x: x.squeeze(), lambda t: t.squeeze()),
    case("squeeze-dims", (1, 3, 1, 2), lambda x: x.squeeze_dims([0, 2]), lambda t: t.squeeze((0, 2))),
    case("squeeze-dims-negative", (1, 3, 1, 2), lambda x: x.squeeze_dims([-2, 0]), lambda t: t.squeeze((-2, 0))),
    case("unsqueeze", (3, 2), lambda x: x.unsqueeze(), lambda t: t.unsqueeze(0)),
    case("unsqueeze-0d", (), lambda x: x.unsqueeze(), lambda t: t.unsqueeze(0)),
    case("unsqueeze-dim", (3, 2), lambda x: x.unsqueeze_dim(1), lambda t: t.unsqueeze(1)),
    case("unsqueeze-dim-last", (3, 2), lambda x: x.unsqueeze_dim(-1), lambda t: t.unsqueeze(-1)),
    case("unsqueeze-dims", (3, 2), lambda x: x.unsqueeze_dims([0, 2]), lambda t: t.unsqueeze(0).unsqueeze(2)),
    case("unsqueeze-dims-negative", (3, 2), lambda x: x.unsqueeze_dims([-1, 0]),
         lambda t: t.unsqueeze(0).unsqueeze(-1)),
    case("permute", (2, 3, 4), lambda x: x.permute(2, 0, 1), lambda t: t.permute(2, 0, 1)),
    case("permute-list", (2, 3, 4), lambda x: x.permute([1, 2, 0]), lambda t: t.permute(1, 2, 0)),
    case("permute-negative", (2, 3, 4), lambda x: x.permute(-1, 0, -2), lambda t: t.permute(2, 0, 1)),
    case("permute-identity", (2, 3), lambda x: x.permute(0, 1), lambda t: t),
    case("permute-0d", (), lambda x: x.permute([]), lambda t: t),
    case("permute-empty", (0, 2, 3), lambda x: x.permute(1, 2, 0), lambda t: t.permute(1, 2, 0)),
    case("swap-dims", (2, 3, 4), lambda x: x.swap_dims(0, 2), lambda t: t.transpose(0, 2)),
    case("swap-dims-negative", (2, 3, 4), lambda x: x.swap_dims(-1, 0), lambda t: t.transpose(-1, 0)),
    case("swap-dims-same", (2, 3), lambda x: x.swap_dims(1, -1), lambda t: t),
    case("transpose", (2, 3), lambda x: x.transpose(), lambda t: t.T),
    case("transpose-batched", (2, 3, 4), lambda x: x.transpose(), lambda t: t.mT),
    case("transpose-1d", (3,), lambda x: x.transpose(), lambda t: t),
    case("T", (2, 3), lambda x: x.T, lambda t: t.T),
    case("T-batched-last-two", (2, 3, 4), lambda x: x.T, lambda t: t.mT),  # Burn's T, not torch's
    case("movedim", (2, 3, 4), lambda x: x.movedim(0, 2), lambda t: t.movedim(0, 2)),
    case("movedim-negative", (2, 3, 4, 5), lambda x: x.movedim(-1, 1), lambda t: t.movedim(-1, 1)),
    case("expand", (3, 1), lambda x: x.expand([2, 3, 4]), lambda t: t.expand(2, 3, 4)),
    case("expand-minus-one", (3, 1), lambda x: x.expand([2, -1, 4]), lambda t: t.expand(2, -1, 4)),
    case("expand-leading", (4,), lambda x: x.expand([2, 3, 4]), lambda t: t.expand(2, 3, 4)),
    case("expand-0d", (), lambda x: x.expand([2, 3]), lambda t: t.expand(2, 3)),
    case("expand-same", (2, 3), lambda x: x.expand([2, 3]), lambda t: t),
    case("expand-to-empty", (1, 3), lambda x: x.expand([0, 3]), lambda t: t.expand(0, 3)),
    case("expand-empty", (1, 0), lambda x: x.expand([3, 0]), lambda t: t.expand(3, 0)),
    case("broadcast-to", (1, 4), lambda x: x.broadcast_to([3, 4]), lambda t: t.broadcast_to(3, 4)),
    case("flip", (3, 4), lambda x: x.flip([0]), lambda t: t.flip(0)),
    case("flip-two-dims", (2, 3, 4), lambda x: x.flip([0, 2]), lambda t: t.flip(0, 2)),
    case("flip-negative", (2, 3, 4), lambda x: x.flip([-1]), lambda t: t.flip(-1)),
    case("flip-none", (2, 3), lambda x: x.flip([]), lambda t: t),
    case("flip-empty", (0, 3), lambda x: x.flip([0, 1]), lambda t: t.flip(0, 1)),
    case("roll", (5, 3), lambda x: x.roll(2, 0), lambda t: t.roll(2, 0)),
    case("roll-negative", (5, 3), lambda x: x.roll(-1, -1), lambda t: t.roll(-1, -1)),
    case("roll-two-dims", (5, 3), lambda x: x.roll([1, -2], [0, 1]), lambda t: t.roll((1, -2), (0, 1))),
    case("roll-past-size", (5, 3), lambda x: x.roll(7, 1), lambda t: t.roll(7, 1)),
    case("roll-full-turn", (5, 3), lambda x: x.roll(5, 0), lambda t: t),
    case("roll-empty", (0, 3), lambda x: x.roll(1, 0), lambda t: t.roll(1, 0)),
    case("narrow", (4, 5), lambda x: x.narrow(1, 1, 3), lambda t: t.narrow(1, 1, 3)),
    case("narrow-negative-start", (4, 5), lambda x: x.narrow(0, -2, 2), lambda t: t.narrow(0, -2, 2)),
    case("narrow-negative-dim", (4, 5), lambda x: x.narrow(-1, 4, 1), lambda t: t.narrow(-1, 4, 1)),
    case("narrow-empty", (4, 5), lambda x: x.narrow(1, 2, 0), lambda t: t.narrow(1, 2, 0)),
    case("repeat", (2, 3), lambda x: x.repeat([2, 1]), lambda t: t.repeat(2, 1)),
    case("repeat-both", (2, 3), lambda x: x.repeat([2, 3]), lambda t: t.repeat(2, 3)),
    case("repeat-leading", (2, 3), lambda x: x.repeat([2, 1, 3]), lambda t: t.repeat(2, 1, 3)),
    case("repeat-0d", (), lambda x: x.repeat([2, 3]), lambda t: t.repeat(2, 3)),
    case("repeat-zero", (2, 3), lambda x: x.repeat([0, 2]), lambda t: t.repeat(0, 2)),
    case("repeat-empty", (0, 2), lambda x: x.repeat([3, 1]), lambda t: t.repeat(3, 1)),
    case("repeat-dim", (2, 3), lambda x: x.repeat_dim(0, 3), lambda t: t.repeat(3, 1)),
    case("repeat-dim-negative", (2, 3), lambda x: x.repeat_dim(-1, 2), lambda t: t.repeat(1, 2)),
    case("repeat-dim-zero", (2, 3), lambda x: x.repeat_dim(1, 0), lambda t: t.repeat(1, 0)),
]  # fmt: skip

# The cases the remaining dtypes also run: one or two per op family.
SWEEP = {"reshape-zero-keeps", "reshape-after-permute", "flatten-range", "squeeze-dims",
         "unsqueeze-dims", "permute", "T-batched-last-two", "movedim-negative", "expand-minus-one",
         "flip-two-dims", "roll-two-dims", "narrow-negative-start", "repeat-leading",
         "repeat-dim"}  # fmt: skip


def run_case(device, dtype: DType, shape, op, ref) -> None:
    x, t = pair(shape, dtype, device)
    assert_same(op(x), ref(t))
    assert_same(x, t)  # the input is unchanged


@pytest.mark.parametrize(("shape", "op", "ref"), CASES)
def test_layout_matches_torch(device, subtests, shape, op, ref):
    each_case(subtests, lambda dtype: run_case(device, dtype, shape, op, ref), dtype=KIND_DTYPES)


@pytest.mark.parametrize("dtype", OTHER_DTYPES)
def test_layout_every_dtype(device, subtests, dtype):
    cases = {c.id: c.values for c in CASES if c.id in SWEEP}
    each_case(subtests, lambda case: run_case(device, dtype, *cases[case]), case=sorted(cases))


# ---------------------------------------------------------------- split and chunk
def assert_pieces(pieces: list[Tensor], expected: tuple[torch.Tensor, ...]) -> None:
    assert [p.shape for p in pieces] == [tuple(e.shape) for e in expected]
    for piece, ref in zip(pieces, expected):
        assert_same(piece, ref)


@pytest.mark.parametrize(
    ("shape", "size", "dim"),
    [((7, 4), 3, 0), ((2, 7), 2, 1), ((2, 7), 7, -1), ((5,), 10, 0), ((0, 3), 2, 0),
     ((7, 4), [2, 0, 5], 0), ((2, 3, 6), [1, 5], -1), ((4,), [4], 0)],
)  # fmt: skip
def test_split(device, subtests, shape, size, dim):
    def check(dtype):
        x, t = pair(shape, dtype, device)
        assert_pieces(x.split(size, dim), torch.split(t, size, dim))

    each_case(subtests, check, dtype=KIND_DTYPES + [DType.BF16, DType.U8])


@pytest.mark.parametrize(
    ("shape", "chunks", "dim"),
    [((7,), 3, 0), ((6,), 4, 0), ((3,), 5, 0), ((6, 4), 2, 0), ((2, 9), 4, -1), ((2, 9), 1, 1),
     ((0,), 2, 0), ((2, 0), 3, 1)],
)  # fmt: skip
def test_chunk(device, subtests, shape, chunks, dim):
    """torch.chunk semantics: pieces of ceil(size / chunks), so there may be fewer than asked;
    an empty dim gives ``chunks`` empty pieces."""

    def check(dtype):
        x, t = pair(shape, dtype, device)
        assert_pieces(x.chunk(chunks, dim), torch.chunk(t, chunks, dim))

    each_case(subtests, check, dtype=KIND_DTYPES + [DType.F16, DType.I8])


# ---------------------------------------------------------------- cat and stack
CAT_CASES = [
    ([(2, 3), (1, 3), (0, 3)], 0),
    ([(2, 1, 4), (2, 3, 4)], 1),
    ([(2, 3), (2, 2), (2, 1)], -1),
    ([(3,)], 0),
    ([(0, 2), (0, 3)], 1),
]


@pytest.mark.parametrize(("shapes", "dim"), CAT_CASES)
def test_cat(device, subtests, shapes, dim):
    def check(dtype):
        pairs = [pair(s, dtype, device, seed=i) for i, s in enumerate(shapes)]
        out = Tensor.cat([x for x, _ in pairs], dim)
        assert_same(out, torch.cat([t for _, t in pairs], dim))

    each_case(subtests, check, dtype=ALL_DTYPES)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize(("shape", "dims"), [((2, 3), [0, 1, 2, -1, -3]), ((), [0, -1]), ((0, 2), [0, 1])])
def test_stack(device, subtests, dtype, shape, dims):
    pairs = [pair(shape, dtype, device, seed=i) for i in range(3)]

    def check(dim):
        out = Tensor.stack([x for x, _ in pairs], dim)
        assert_same(out, torch.stack([t for _, t in pairs], dim))

    each_case(subtests, check, dim=dims)


PROMOTIONS = [(DType.F16, DType.BF16), (DType.F32, DType.F64), (DType.BF16, DType.F32),
              (DType.I8, DType.U8), (DType.I32, DType.I64), (DType.U8, DType.I16)]  # fmt: skip


@pytest.mark.parametrize(("a", "b"), PROMOTIONS)
@pytest.mark.parametrize("join", ["cat", "stack"])
def test_cat_stack_promote_dtypes(device, a, b, join):
    """Tensors of one kind and different dtypes promote as in torch (f16 with bf16 gives f32)."""
    (x, t), (y, u) = pair((2, 3), a, device), pair((2, 3), b, device, seed=1)
    out = getattr(Tensor, join)([x, y], 1)
    assert_same(out, getattr(torch, join)([t, u], 1))


def tensors_of(device, *specs) -> list[Tensor]:
    return [pair(shape, dtype, device)[0] for shape, dtype in specs]


def join_error(name: str, join: str, specs, dim: int, exc, match: str):
    return pytest.param(join, specs, dim, exc, match, id=name)


JOIN_ERRORS = [
    join_error("cat-kinds", "cat", [((2, 3), DType.F32), ((2, 3), DType.I64)], 0, KindError,
               r"cat: tensors of kinds Float and Int"),
    join_error("cat-bool-float", "cat", [((2, 3), DType.BOOL), ((2, 3), DType.F32)], 0, KindError,
               r"cat: tensors of kinds Bool and Float"),
    join_error("cat-shapes", "cat", [((2, 3), DType.F32), ((2, 4), DType.F32)], 0, ShapeError,
               r"cat: shapes \[2, 3\] and \[2, 4\] differ outside dim 0"),
    join_error("cat-ranks", "cat", [((2, 3), DType.I32), ((2, 3, 1), DType.I32)], 1, ShapeError,
               r"cat: shapes \[2, 3\] and \[2, 3, 1\] differ"),
    join_error("cat-dim", "cat", [((2, 3), DType.F32), ((2, 3), DType.F32)], 2, ArgumentError,
               r"cat: dim 2 is out of range for a tensor of rank 2"),
    join_error("cat-0d", "cat", [((), DType.F32), ((), DType.F32)], 0, ShapeError,
               r"cat: cannot concatenate 0-d tensors \(shape \[\]\)"),
    join_error("stack-shapes", "stack", [((2, 3), DType.F32), ((3, 2), DType.F32)], 0, ShapeError,
               r"stack: shapes \[2, 3\] and \[3, 2\] differ"),
    join_error("stack-kinds", "stack", [((2, 3), DType.F32), ((2, 3), DType.I64)], 0, KindError,
               r"stack: tensors of kinds Float and Int"),
    join_error("stack-dim", "stack", [((2, 3), DType.F32)], 3, ArgumentError,
               r"stack: dim 3 is out of range for a tensor of rank 3"),
]  # fmt: skip


@pytest.mark.parametrize(("join", "specs", "dim", "error", "match"), JOIN_ERRORS)
def test_cat_stack_errors(device, join, specs, dim, error, match):
    with pytest.raises(error, match=match):
        getattr(Tensor, join)(tensors_of(device, *specs), dim)


@pytest.mark.parametrize("join", ["cat", "stack"])
def test_cat_stack_need_a_tensor(join):
    with pytest.raises(ArgumentError, match=f"{join}: needs at least one tensor"):
        getattr(Tensor, join)([])


# ---------------------------------------------------------------- tril and triu
@pytest.mark.parametrize("dtype", KIND_DTYPES)
@pytest.mark.parametrize("shape", [(4, 5), (5, 3), (2, 3, 4), (2, 1, 3, 3), (0, 3)])
def test_triangle(device, subtests, dtype, shape):
    x, t = pair(shape, dtype, device)

    def check(diagonal, op):
        assert_same(getattr(x, op)(diagonal), getattr(torch, op)(t, diagonal))

    each_case(subtests, check, diagonal=[-2, -1, 0, 1, 4], op=["tril", "triu"])


@pytest.mark.parametrize("dtype", OTHER_DTYPES)
def test_triangle_every_dtype(device, dtype):
    x, t = pair((2, 4, 3), dtype, device)
    assert_same(x.tril(-1), torch.tril(t, -1))
    assert_same(x.triu(1), torch.triu(t, 1))


# ---------------------------------------------------------------- pad
TORCH_MODE = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}
PAD_CASES = [((2, 5), (2, 1)), ((2, 4, 5), (1, 2, 2, 0)), ((1, 2, 4, 5), (0, 3, 1, 1)),
             ((2, 3, 4, 5), (1, 1, 0, 2, 2, 1))]  # fmt: skip


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize(("shape", "pads"), PAD_CASES)
def test_pad_float(device, subtests, mode, shape, pads):
    """Modes constant / reflect / edge against torch's constant / reflect / replicate."""

    def check(dtype):
        x, t = pair(shape, dtype, device)
        if mode == "constant":
            expected = F.pad(t, pads, value=2.5)
        else:
            expected = F.pad(t, pads, mode=TORCH_MODE[mode])
        assert_same(x.pad(pads, value=2.5, mode=mode), expected)

    each_case(subtests, check, dtype=FLOAT_DTYPES)


@pytest.mark.parametrize("mode", ["reflect", "edge"])
def test_pad_more_than_three_dims(device, mode):
    # torch's own reflect / replicate kernels stop at 3 padded dims; NumPy's pad is the reference.
    x, t = pair((2, 3, 4, 5, 3), DType.F32, device)
    pads = (1, 1, 0, 2, 1, 0, 2, 1, 0, 1)  # (left, right) of the last dim first, as torch
    widths = [pads[i : i + 2] for i in range(0, len(pads), 2)][::-1]
    expected = np.pad(t.numpy(), widths, mode="reflect" if mode == "reflect" else "edge")
    assert_same(x.pad(pads, mode=mode), torch.from_numpy(expected))


@pytest.mark.parametrize("dtype", INT_DTYPES + [DType.BOOL])
@pytest.mark.parametrize(("shape", "pads"), [((2, 5), (2, 1)), ((2, 4, 5), (1, 2, 0, 3)), ((3,), (1, 1))])
def test_pad_constant_int_bool(device, dtype, shape, pads):
    x, t = pair(shape, dtype, device)
    value = True if dtype is DType.BOOL else 7
    assert_same(x.pad(pads, value=value), F.pad(t, pads, value=value))


@pytest.mark.parametrize("dtype", KIND_DTYPES)
@pytest.mark.parametrize(("shape", "pads"), [((2, 5), (-1, 2)), ((3, 4), (-1, -1, 0, -2)), ((2, 3), (0, 0)),
                                             ((0, 3), (1, 1)), ((2, 3), (0, 0, 1, 0))])  # fmt: skip
def test_pad_constant_crop_and_empty(device, dtype, shape, pads):
    """Negative pads crop (torch's constant mode allows them); a 0-size dim pads like any other."""
    x, t = pair(shape, dtype, device)
    assert_same(x.pad(pads), F.pad(t, pads))


# ---------------------------------------------------------------- bad input
def error(name: str, shape, op, exc, match: str):
    return pytest.param(tuple(shape), op, exc, match, id=name)


ERRORS = [
    error("reshape-count", (2, 3), lambda x: x.reshape([4, 2]), ShapeError,
          r"reshape: cannot reshape \[2, 3\] \(6 elements\) into \[4, 2\]"),
    error("reshape-negative", (2, 3), lambda x: x.reshape([-2, -3]), ShapeError,
          r"reshape: cannot reshape \[2, 3\] .*into \[-2, -3\]"),
    error("reshape-two-minus-one", (2, 3), lambda x: x.reshape([-1, -1]), ShapeError,
          r"reshape: only one dim can be -1, got \[-1, -1\]"),
    error("reshape-minus-one-indivisible", (2, 3), lambda x: x.reshape([-1, 4]), ShapeError,
          r"reshape: cannot reshape \[2, 3\] into \[-1, 4\]"),
    error("view-count", (2, 3, 4), lambda x: x.view([5, -1]), ShapeError,
          r"reshape: cannot reshape \[2, 3, 4\] into \[5, -1\]"),
    error("flatten-order", (2, 3, 4), lambda x: x.flatten(2, 0), ArgumentError,
          r"flatten: start_dim 2 comes after end_dim 0"),
    error("flatten-dim", (2, 3), lambda x: x.flatten(0, 5), ArgumentError,
          r"flatten: dim 5 is out of range for a tensor of rank 2"),
    error("squeeze-not-one", (2, 3), lambda x: x.squeeze(0), ShapeError,
          r"squeeze: dim 0 of shape \[2, 3\] has size 2, not 1"),
    error("squeeze-dim-range", (1, 3), lambda x: x.squeeze(2), ArgumentError,
          r"squeeze: dim 2 is out of range for a tensor of rank 2"),
    error("squeeze-dims-not-one", (1, 3), lambda x: x.squeeze_dims([0, 1]), ShapeError,
          r"squeeze_dims: dim 1 of shape \[1, 3\] has size 3, not 1"),
    error("unsqueeze-dim-range", (2, 3), lambda x: x.unsqueeze_dim(4), ArgumentError,
          r"unsqueeze_dim: dim 4 is out of range for a tensor of rank 3"),
    error("unsqueeze-dims-range", (2, 3), lambda x: x.unsqueeze_dims([0, 5]), ArgumentError,
          r"unsqueeze_dims: dim 5 is out of range for a tensor of rank 4"),
    error("permute-repeated", (2, 3, 4), lambda x: x.permute(0, 0, 1), ArgumentError,
          r"permute: \[0, 0, 1\] is not a permutation of the dims of rank 3"),
    error("permute-short", (2, 3, 4), lambda x: x.permute(1, 0), ArgumentError,
          r"permute: \[1, 0\] is not a permutation of the dims of rank 3"),
    error("permute-range", (2, 3, 4), lambda x: x.permute(0, 1, 3), ArgumentError,
          r"permute: dim 3 is out of range for a tensor of rank 3"),
    error("swap-dims-range", (2, 3), lambda x: x.swap_dims(0, 2), ArgumentError,
          r"swap_dims: dim 2 is out of range for a tensor of rank 2"),
    error("movedim-range", (2, 3), lambda x: x.movedim(0, -3), ArgumentError,
          r"movedim: dim -3 is out of range for a tensor of rank 2"),
    error("expand-incompatible", (3, 2), lambda x: x.expand([3, 3]), ShapeError,
          r"expand: cannot expand shape \[3, 2\] to \[3, 3\]"),
    error("expand-fewer-dims", (2, 3), lambda x: x.expand([3]), ShapeError,
          r"expand: cannot expand shape \[2, 3\] to \[3\]"),
    error("expand-new-dim-minus-one", (3,), lambda x: x.expand([-1, 3]), ShapeError,
          r"expand: -1 is not allowed for the new leading dim 0"),
    error("broadcast-to-incompatible", (2, 3), lambda x: x.broadcast_to([2, 2]), ShapeError,
          r"expand: cannot expand shape \[2, 3\] to \[2, 2\]"),
    error("flip-repeated", (2, 3), lambda x: x.flip([1, -1]), ArgumentError,
          r"flip: repeated dim in \[1, 1\]"),
    error("flip-range", (2, 3), lambda x: x.flip([2]), ArgumentError,
          r"flip: dim 2 is out of range for a tensor of rank 2"),
    error("roll-mismatch", (2, 3), lambda x: x.roll([1, 2], [0]), ArgumentError,
          r"roll: 2 shifts for 1 dims"),
    error("roll-range", (2, 3), lambda x: x.roll(1, 2), ArgumentError,
          r"roll: dim 2 is out of range for a tensor of rank 2"),
    error("narrow-past-end", (4, 5), lambda x: x.narrow(1, 3, 3), ArgumentError,
          r"narrow: start 3 and length 3 exceed dim 1 of size 5"),
    error("narrow-negative-length", (4, 5), lambda x: x.narrow(0, 0, -1), ArgumentError,
          r"narrow: start 0 and length -1 exceed dim 0 of size 4"),
    error("split-sizes", (5,), lambda x: x.split([2, 2]), ShapeError,
          r"split: sizes \[2, 2\] do not add up to dim 0 of size 5"),
    error("split-zero", (5,), lambda x: x.split(0), ArgumentError,
          r"split: split_size must be positive, got 0"),
    error("chunk-zero", (5,), lambda x: x.chunk(0), ArgumentError,
          r"chunk: chunks must be positive, got 0"),
    error("repeat-short", (2, 3), lambda x: x.repeat([2]), ArgumentError,
          r"repeat: 1 sizes for a tensor of rank 2"),
    error("repeat-dim-negative", (2, 3), lambda x: x.repeat_dim(0, -1), ArgumentError,
          r"repeat_dim: times must be >= 0, got -1"),
    error("tril-rank", (3,), lambda x: x.tril(), ShapeError, r"tril: needs rank >= 2, got \[3\]"),
    error("triu-rank", (), lambda x: x.triu(1), ShapeError, r"triu: needs rank >= 2, got \[\]"),
    error("pad-odd", (2, 3), lambda x: x.pad([1, 2, 3]), ArgumentError,
          r"pad: needs an even number of values, got 3"),
    error("pad-too-many-dims", (3,), lambda x: x.pad([1, 1, 1, 1]), ShapeError,
          r"pad: 2 padded dims for a tensor of rank 1"),
    error("pad-mode", (2, 3), lambda x: x.pad([1, 1], mode="circular"), ArgumentError,
          r"pad: unknown mode 'circular'"),
    error("pad-reflect-too-wide", (2, 3), lambda x: x.pad([3, 0], mode="reflect"), ArgumentError,
          r"pad: reflect padding \(3, 0\) must be smaller than dim size 3"),
    error("pad-edge-empty", (2, 0), lambda x: x.pad([1, 0], mode="edge"), ArgumentError,
          r"pad: edge padding of an empty dim"),
    error("pad-crop-too-much", (2, 3), lambda x: x.pad([-2, -2]), ShapeError,
          r"pad: padding \(-2, -2\) makes dim 1 negative"),
]  # fmt: skip


@pytest.mark.parametrize(("shape", "op", "exc", "match"), ERRORS)
def test_bad_input(device, shape, op, exc, match):
    x, _ = pair(shape, DType.F32, device)
    with pytest.raises(exc, match=match):
        op(x)


def test_pad_int_with_float_value(device):
    x, _ = pair((2, 3), DType.I32, device)
    with pytest.raises(KindError, match=r"pad: a float scalar \(2.5\) with an Int tensor"):
        x.pad([1, 1], value=2.5)


# ---------------------------------------------------------------- Hypothesis round trips
@st.composite
def shape_and_permutation(draw):
    shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=4))
    return tuple(shape), tuple(draw(st.permutations(range(len(shape)))))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=shape_and_permutation(), split=st.integers(0, 4))
def test_permute_reshape_round_trip(device, case, split):
    """permute then the inverse permutation, and reshape to 2-d and back, give the input again."""
    shape, perm = case
    x, t = pair(shape, DType.I32, device)
    permuted = x.permute(perm)
    assert_same(permuted, t.permute(perm))
    assert_same(permuted.permute(tuple(np.argsort(perm).tolist())), t)
    split = min(split, len(shape))
    matrix = (math.prod(shape[:split]), math.prod(shape[split:]))
    assert_same(x.reshape(matrix), t.reshape(matrix))
    assert_same(permuted.reshape(matrix).reshape(permuted.shape), t.permute(perm))
    assert_same(x.reshape([-1]).reshape(shape), t)
