"""What a DelayedScalingState's values may be, and the one rule about its
use that the values cannot show in time: one call per state per
differentiated step.

Values (fp8kit.checkpoint.STATE_RULES, the rule fp8kit.torch applies to a
Linear's saved state, so that a state either framework rejects is the
same): amax_history >= 0 (an amax is
a max of |x|; NaN and +inf are amaxes of tensors that held them, which the
update skips), scale finite and > 0 (every cast multiplies by it),
seeded 0.0 or 1.0 (a flag kept as float32 only so that it has a
cotangent). They are checked where a state's values exist in Python: a
concrete state (not traced), at construction from arrays, at a checkpoint
load and at an eager layer call. Under jit they are tracers and only the
shapes and dtypes are checked.

Use: the updated state leaves a layer as the cotangent of the old one, so
two calls on one state in one differentiated function sum two updated
states (scales doubled, seeded 2.0) and the next step runs on that. Under
jax.grad the calls see the same AD tracer of the state, which is how a
second call is caught while tracing, before anything runs: a module of
fp8kit.jax.flax called twice per step is the usual way to get there.
"""

from __future__ import annotations

import threading
import weakref
from typing import Optional

import jax

from fp8kit import checkpoint
from fp8kit.checkpoint import STATE_FIELDS

# Private: JAX has no public way to ask whether a tracer belongs to the
# differentiation being traced now.
from jax._src import core as _core
from jax._src.interpreters import ad as _ad

FIELDS = STATE_FIELDS
ONE_CALL_PER_STEP = ("Use each state in exactly one call per step (its updated value leaves "
                     "as its cotangent, and the cotangents of two uses add up); a module of "
                     "fp8kit.jax.flax holds one state, so call it once per step, or make one "
                     "module per use.")
_AD_TRACERS = tuple(t for t in (getattr(_ad, "JVPTracer", None),
                                getattr(_ad, "LinearizeTracer", None)) if t is not None)


def is_concrete(state) -> bool:
    """Whether the state's values can be read in Python: no field is a
    tracer, and each is whole on this process."""
    return all(not isinstance(a, jax.core.Tracer) and getattr(a, "is_fully_addressable", True)
               for a in (getattr(state, f) for f in FIELDS))


def first_bad_value(state, fix: str) -> Optional[str]:
    """"FIELD holds X (flat index i); FIELD values must be ...: fix" for the
    first value of a concrete state that breaks its field's rule, else
    None. A whole seeded above 1 says instead what made it (several uses)."""
    for field in FIELDS:
        bad = checkpoint.first_bad_value(field, getattr(state, field))
        if bad is None:
            continue
        value, text = bad
        if field == "seeded" and value > 1 and value == round(value):
            return (f"{text}. A seeded of {value:g} is what {value:g} uses of one state in a "
                    f"differentiated step leave (its scales summed too). {ONE_CALL_PER_STEP}")
        return f"{text}: {fix}"
    return None


class _Uses:
    """The state leaves each differentiation being traced has handed a
    layer call. Keyed weakly by the trace and the tracers: an entry lives
    as long as the trace, and a finished trace leaves nothing behind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_trace = weakref.WeakKeyDictionary()  # trace -> {id(leaf): leaf}

    def record(self, fn: str, state) -> None:
        """Note a call of `fn` on `state`; a ValueError if a leaf of it is
        already used by a call of the current differentiation."""
        current = _core.trace_ctx.trace
        leaves = [a for a in (getattr(state, f) for f in FIELDS)
                  if isinstance(a, _AD_TRACERS) and a._trace is current]
        if not leaves:  # not differentiated here: reading a state twice is harmless
            return
        with self._lock:
            seen = self._by_trace.setdefault(current, weakref.WeakValueDictionary())
            if any(seen.get(id(a)) is a for a in leaves):
                raise ValueError(
                    f"{fn}: this DelayedScalingState is already used by another call in the "
                    f"function being differentiated; the next state would be the sum of both "
                    f"calls' updates (scales doubled, seeded 2.0). {ONE_CALL_PER_STEP}")
            for a in leaves:
                seen[id(a)] = a


USES = _Uses()


def check_float32_arrays(fn: str, arrays: dict) -> None:
    """Every value of `arrays` a float32 array (TypeError naming it)."""
    import jax.numpy as jnp
    for name, a in arrays.items():
        if not hasattr(a, "dtype") or not hasattr(a, "shape"):
            raise TypeError(f"{fn}: {name} is a {type(a).__name__}; pass a float32 array")
        if jnp.dtype(a.dtype) != jnp.float32:
            raise TypeError(f"{fn}: {name} has dtype {jnp.dtype(a.dtype)}; the state is "
                            f"float32: pass {name}.astype(jnp.float32)")


def check_saved_state(fn: str, state, state_dict, sizes: str) -> None:
    """`state_dict` (a saved state as Flax restores it) holds exactly the
    FIELDS, each of `state`'s shape; ValueError naming what differs and,
    for a shape, the sizes that set it (`sizes`)."""
    import numpy as np
    kind = type(state).__name__
    if not isinstance(state_dict, dict) or set(state_dict) != set(FIELDS):
        keys = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
        raise ValueError(f"{fn}: the saved state is {keys}; a {kind} is saved as a dict of "
                         f"{list(FIELDS)}")
    for name in FIELDS:
        saved, here = np.shape(state_dict[name]), tuple(getattr(state, name).shape)
        if saved != here:
            raise ValueError(f"{fn}: saved {name} has shape {saved}, this state's {here}: the "
                             f"checkpoint was written by a layer of another size or recipe "
                             f"({sizes})")
