"""The math-verify worker process: `python -m rsgen.verifiers._math_worker`, started by `rsgen.verifiers.mathexpr`.

It reads one JSON request per line on stdin ({"gold": [str, ...], "pred": str, "timeout": seconds}) and
writes one JSON reply per line on stdout ({"status": "match" | "nomatch" | "timeout" | "error"}).

Why a separate process: math-verify's own time limit is `signal.alarm`, which only works in the main thread
of the main interpreter (it raises ValueError elsewhere: trainer threads, data loader threads, web servers),
takes whole seconds, and turns a timeout into a plain `False` that cannot be told apart from a wrong answer.
Here each item runs under a `setitimer` alarm (fractional seconds) that raises an exception math-verify's
`except Exception` handlers cannot swallow, so a timeout is reported as one. Work stuck in C code, which no
signal interrupts, is the parent's job: it kills this process when the reply is late. An address-space limit
keeps a runaway big-number computation from exhausting the machine's memory.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
import warnings

MEMORY_LIMIT_BYTES = int(os.environ.get("RSGEN_MATH_WORKER_MEMORY_MB", "4096")) * 1024 * 1024
_GOLD_CACHE_SIZE = 4096


class ItemTimeout(BaseException):
    """Raised by the alarm; a BaseException so that `except Exception` inside math-verify/sympy lets it pass."""


def _on_alarm(signum, frame):
    raise ItemTimeout()


def _parse(parse, text: str):
    text = text.strip()
    if len(text) >= 2 and text[0] == "$" and text[-1] == "$":
        text = text.strip("$").strip()
    if "\\boxed" not in text:
        # math-verify finds LaTeX inside delimiters; a bare answer ("\frac{1}{2}", "x+1") needs one.
        text = "\\boxed{" + text + "}"
    return parse(text, parsing_timeout=None)


def _matches(parse, verify, golds: list[str], pred: str, gold_cache: dict[str, list]) -> bool:
    pred_parsed = _parse(parse, pred)
    if not pred_parsed:
        return False
    for gold in golds:
        gold_parsed = gold_cache.get(gold)
        if gold_parsed is None:
            gold_parsed = _parse(parse, gold)
            if len(gold_cache) >= _GOLD_CACHE_SIZE:
                gold_cache.clear()
            gold_cache[gold] = gold_parsed
        if gold_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None):
            return True
    return False


def main() -> int:
    # The protocol gets a private copy of stdout; anything a library prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "w", encoding="ascii")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    warnings.simplefilter("ignore")
    logging.disable(
        logging.WARNING
    )  # math-verify warns once that its own timeouts are off: they are, on purpose
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT_BYTES, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass  # a platform without RLIMIT_AS: the parent's kill still bounds time
    from math_verify import parse, verify

    _parse(parse, "1")  # first parse builds latex2sympy's grammar; keep that out of the first item's time
    signal.signal(signal.SIGALRM, _on_alarm)
    gold_cache: dict[str, list] = {}
    out.write('{"status": "ready"}\n')
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            golds, pred, timeout = request["gold"], request["pred"], float(request["timeout"])
        except (ValueError, KeyError, TypeError):
            out.write('{"status": "error"}\n')
            out.flush()
            continue
        status = "nomatch"
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, timeout)
                if _matches(parse, verify, golds, pred, gold_cache):
                    status = "match"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except ItemTimeout:  # also when the alarm lands between the work's end and the reset above
            status = "timeout"
        except (MemoryError, RecursionError):
            status = "timeout"  # out of resources for this item: the same outcome as running out of time
        except Exception:
            status = "error"
        out.write(json.dumps({"status": status}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
