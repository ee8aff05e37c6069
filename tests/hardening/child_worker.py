"""The child process the hardening tests run in (see child_process.py).

Reads one JSON request per line on stdin - {"module", "function",
"kwargs"} - runs module.function(**kwargs) and answers one JSON line,
{"outcome": "passed" | "failed" | "skipped", "text": ...}, on the file
descriptor it was given (stdout is redirected to stderr, so prints and C
libraries' output cannot break the protocol).

Before each hypothesis example, the function under test writes a
reproducer line to the file named by FP8KIT_HARDENING_EXAMPLE_LOG
(strategies.py); when this process dies of a signal, the parent reports
that line.

Run by hand to reproduce one test outside pytest (what a failure prints):
    python tests/hardening/child_worker.py MODULE FUNCTION '{"device": "cpu"}'
"""

import faulthandler
import importlib
import json
import os
import sys
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))
# This folder (the test modules) and tests/ (the shared fp8_reference), also
# when run by hand.
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]


def _run(request) -> dict:
    import pytest
    try:
        module = importlib.import_module(request["module"])
        getattr(module, request["function"])(**request.get("kwargs", {}))
    except pytest.skip.Exception as e:
        return {"outcome": "skipped", "text": str(e)}
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        return {"outcome": "failed", "text": "".join(traceback.format_exception(e))}
    return {"outcome": "passed", "text": ""}


def serve() -> None:
    # On a fatal signal, the Python stack of every thread goes to stderr,
    # which the parent shows with the failure.
    faulthandler.enable()
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if line.strip():
            answers.write(json.dumps(_run(json.loads(line))) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        kwargs = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
        result = _run({"module": sys.argv[1], "function": sys.argv[2], "kwargs": kwargs})
        print(result["outcome"], result["text"], sep="\n")
        sys.exit(result["outcome"] == "failed")
    serve()
