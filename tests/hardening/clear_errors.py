"""The suite's rule for a bad argument: the call raises TypeError,
ValueError or NotImplementedError, and the message names the function
(its full name, fp8kit.torch.gemm, or its own name, gemm, as a word), so
the user sees which call was wrong. Anything else - another exception, or
no error at all - fails the test."""

from __future__ import annotations

import re

CLEAR_ERRORS = (TypeError, ValueError, NotImplementedError)


def names(message: str, fn_name: str) -> bool:
    short = fn_name.rsplit(".", 1)[-1]
    return fn_name in message or re.search(rf"\b{re.escape(short)}\b", message) is not None


def expect_clear_error(fn_name: str, call, *args, settle=None, **kwargs):
    """call(*args, **kwargs) (then settle(result), e.g. waiting for an
    asynchronous result) must raise a clear error naming `fn_name`."""
    try:
        result = call(*args, **kwargs)
        if settle is not None:
            settle(result)
    except CLEAR_ERRORS as e:
        assert names(str(e), fn_name), (
            f"the error does not name {fn_name}: {type(e).__name__}: {e}")
        return e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{fn_name}: expected TypeError/ValueError/NotImplementedError, "
                             f"got {type(e).__name__}: {e}") from e
    raise AssertionError(f"{fn_name}: accepted a bad argument without an error")
