"""The core's Linear plan (ext.linear_plan: which FP8 copies each cast
writes and which a forward keeps) for a token count that may be symbolic.

torch.compile traces a dynamic token dimension as a SymInt, which the
extension's call cannot take and which must not be forced to an int (that
would specialize the graph on it: one compilation per token count). The
plan depends on the token count only in two ways (fp8kit/linear.h):

* the copies: on non-TN devices, whether the count is a multiple of
  GEMM_DIM_MULTIPLE (wgrad then reads padded columnwise copies); on TN-only
  devices (the CPU, Ada, Hopper) not at all;
* wgrad_inner: the count, rounded up to GEMM_DIM_MULTIPLE when wgrad reads
  columnwise copies.

So the core is asked about a stand-in count of the same alignment class
(a constant while dynamo traces: the extension's call is not traced), and
wgrad_inner is computed from the real count with arithmetic a SymInt
keeps symbolic. tests/torch/test_torch_compile_dynamic.py checks the
result against the core's plan.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from fp8kit.torch._ext import ext

_MULTIPLE = ext.GEMM_DIM_MULTIPLE


class Plan(NamedTuple):
    """ext.linear_plan's answer; each copies entry is (rowwise, columnwise)."""
    input: tuple
    weight: tuple
    grad_output: tuple
    saved_input: tuple
    saved_weight: tuple
    wgrad_columnwise: bool
    wgrad_inner: int


@functools.lru_cache(maxsize=1024)
def _cached_plan(tokens: int, in_features: int, out_features: int, dgrad: bool, wgrad: bool,
                 non_tn: bool) -> Plan:
    return Plan(*ext.linear_plan(tokens, in_features, out_features, dgrad, wgrad, non_tn))


# A constant while dynamo traces: every argument is one.
@torch.compiler.assume_constant_result
def _core_plan(tokens: int, in_features: int, out_features: int, dgrad: bool, wgrad: bool,
               non_tn: bool) -> Plan:
    return _cached_plan(tokens, in_features, out_features, dgrad, wgrad, non_tn)


def plan(tokens, in_features, out_features, dgrad: bool, wgrad: bool, non_tn: bool) -> Plan:
    """The plan for `tokens` rows (an int or a SymInt). Only on a non-TN
    device does a symbolic count get a guard: on its alignment, which picks
    other copies there."""
    aligned = not non_tn or tokens % _MULTIPLE == 0
    # The features are a weight's, fixed per layer: ints (when a trace
    # makes every size symbolic, as opcheck's does, forcing them to ints
    # specializes only what a layer never varies).
    p = _core_plan(_MULTIPLE if aligned else 1, int(in_features), int(out_features), dgrad,
                   wgrad, non_tn)
    inner = (tokens + _MULTIPLE - 1) // _MULTIPLE * _MULTIPLE if p.wgrad_columnwise else tokens
    return Plan(p.input, p.weight, p.grad_output, p.saved_input, p.saved_weight,
                p.wgrad_columnwise, inner)


def kept(copies: tuple, rowwise, columnwise):
    """The copy a plan's saved_input / saved_weight entry names (at most
    one), or None."""
    if copies[0]:
        return rowwise
    return columnwise if copies[1] else None
