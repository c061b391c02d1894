"""Verifier throughput: QA pairs per second for each verifier, on realistic pairs.

    python bench/bench_verify.py [--pairs 100000] [--math-pairs 2000] [--repeats 3] [--seed 0]

For each verifier it draws `--pairs` QA pairs the way a run produces them: a reference (chart values with
percents/thousands separators/units, counts, yes/no and colour words, option letters, LaTeX expressions)
and a raw model response, half of them with reasoning (`<think>...</think>` of a few hundred characters,
some with only the closing tag as when the chat template pre-fills `<think>`, a few never closed) and half
without (a bare answer, "The answer is ...", `\\boxed{...}`, `<answer>...</answer>`, a sentence of
chain-of-thought). Answers are right, nearly right, or wrong.

Two rates per verifier: "extracted" times `compare` on answers already extracted; "raw" times
`verify_response` on the raw responses (extraction included). Each is the best of `--repeats` runs
(other processes share the CPU); the median is shown too, and the rate per CPU-second this process used,
which other processes affect much less. The verifiers memoise normalised short answers; the memo is
cleared before every timed run, so no run profits from the last. `math` runs fewer pairs (math-verify
parses with sympy, milliseconds per item) and includes its worker process round trip.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rsgen.verifiers import clear_caches, compare, extract_answer, verify_response  # noqa: E402

WORDS = [
    "Yes",
    "No",
    "Blue",
    "Red",
    "Green",
    "Asia",
    "Europe",
    "Male",
    "Female",
    "Facebook",
    "Twitter",
    "Dem",
    "Rep",
]
UNITS = ["", "", "", "", "%", " million", " kg", " years", " USD"]
REASONING_SENTENCES = [
    "Let me look at the chart carefully.",
    "The x-axis shows the years from 2010 to 2020 and the y-axis shows the share of respondents.",
    "The tallest bar is the third one, and it reaches a bit above the gridline.",
    "Wait, I should double-check the legend to be sure which colour is which.",
    "Counting the objects: there are two cubes, one sphere and a cylinder behind them.",
    "Subtracting the large rubber objects leaves the small metal ones.",
    "So the value is approximately what the label says.",
    "Hmm, the question asks for the difference, not the sum.",
]


def _number_reference(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.35:
        return str(rng.randint(0, 20))
    if kind < 0.6:
        return f"{rng.uniform(0, 100):.1f}"
    if kind < 0.75:
        return f"{rng.randint(1000, 999999):,}"
    if kind < 0.9:
        return f"{rng.randint(1, 99)}%"
    return f"{rng.uniform(0, 1):.2f}"


def _perturb_number(reference: str, rng: random.Random) -> str:
    text = reference.replace(",", "").rstrip("%")
    value = float(text)
    roll = rng.random()
    if roll < 0.5:
        answer = reference  # right, as written
    elif roll < 0.65:
        answer = f"{value * rng.uniform(0.97, 1.03):.2f}"  # read off the axis, within 5%
    elif roll < 0.75:
        answer = f"{value:g}" + rng.choice(UNITS)  # with a unit
    else:
        answer = f"{value * rng.uniform(1.2, 3) + 1:.1f}"  # wrong
    return answer


def _qa(verifier: str, rng: random.Random) -> tuple[str, str, list[str] | None]:
    """(reference, final answer as the model writes it, options)."""
    if verifier in ("relaxed", "numeric"):
        if verifier == "relaxed" and rng.random() < 0.3:
            ref = rng.choice(WORDS)
            return ref, (ref if rng.random() < 0.7 else rng.choice(WORDS)).lower(), None
        ref = _number_reference(rng)
        return ref, _perturb_number(ref, rng), None
    if verifier == "exact":
        if rng.random() < 0.6:
            ref = str(rng.randint(0, 10))
            return ref, ref if rng.random() < 0.75 else str(rng.randint(0, 10)), None
        ref = rng.choice(WORDS)
        return ref, ref if rng.random() < 0.7 else rng.choice(WORDS), None
    if verifier == "mc":
        options = rng.sample(["red", "blue", "green", "yellow", "a cube", "a sphere", "two", "three"], 4)
        ref = rng.choice("ABCD")
        letter = ref if rng.random() < 0.7 else rng.choice("ABCD")
        style = rng.random()
        if style < 0.3:
            answer = letter
        elif style < 0.5:
            answer = f"({letter})"
        elif style < 0.7:
            answer = f"{letter}. {options[ord(letter) - 65]}"
        elif style < 0.85:
            answer = f"**{letter}**"
        else:
            answer = options[ord(letter) - 65]
        return ref, answer, options
    if verifier == "math":
        a, b = rng.randint(1, 9), rng.randint(2, 12)
        forms = [
            (
                f"\\frac{{{a}}}{{{b}}}",
                [f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}", f"\\dfrac{{{a * 2}}}{{{b * 2}}}", f"{a / b:.6f}"],
            ),
            (f"{a}\\sqrt{{{b}}}", [f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}", f"{a + 1}\\sqrt{{{b}}}"]),
            (f"x^2+{2 * a}x+{a * a}", [f"(x+{a})^2", f"x^2+{2 * a}x+{a * a}", f"(x+{a + 1})^2"]),
            (str(a * b), [str(a * b), str(a * b + 1), f"{a}\\cdot {b}"]),
        ]
        ref, answers = rng.choice(forms)
        return ref, rng.choice(answers), None
    raise ValueError(verifier)


def _response(answer: str, rng: random.Random) -> str:
    reasoning = " ".join(rng.choice(REASONING_SENTENCES) for _ in range(rng.randint(3, 12)))
    style = rng.random()
    if style < 0.5:  # reasoning enabled
        tail = rng.choice(
            [answer, f"The answer is {answer}.", f"\\boxed{{{answer}}}", f"**Answer:** {answer}"]
        )
        roll = rng.random()
        if roll < 0.03:
            return f"<think>\n{reasoning}"  # cut off at the token limit
        if roll < 0.4:
            return f"{reasoning}\n</think>\n\n{tail}"  # template pre-filled <think>
        return f"<think>\n{reasoning}\n</think>\n\n{tail}"
    if style < 0.7:
        return answer
    if style < 0.8:
        return f"The answer is {answer}."
    if style < 0.88:
        return f"{reasoning} So the final answer is \\boxed{{{answer}}}."
    if style < 0.93:
        return f"<answer>{answer}</answer>"
    return f"{reasoning}\nAnswer: {answer}"


def make_pairs(verifier: str, n: int, seed: int) -> list[tuple[str, str, str, list[str] | None]]:
    """n tuples (raw response, extracted answer, reference, options)."""
    rng = random.Random(f"{verifier}:{seed}")
    pairs = []
    for _ in range(n):
        ref, answer, options = _qa(verifier, rng)
        raw = _response(answer, rng)
        pairs.append((raw, extract_answer(raw).answer, ref, options))
    return pairs


def _rate(fn, n: int, repeats: int) -> tuple[float, float, float]:
    """(best wall-clock rate, median wall-clock rate, best rate per CPU-second of this process)."""
    rates, cpu_rates = [], []
    for _ in range(repeats):
        clear_caches()  # every run starts cold, as a real run that sees each pair once would
        start, cpu_start = time.perf_counter(), time.process_time()
        fn()
        rates.append(n / (time.perf_counter() - start))
        cpu_rates.append(n / max(time.process_time() - cpu_start, 1e-9))
    return max(rates), statistics.median(rates), max(cpu_rates)


def bench(verifier: str, n: int, repeats: int, seed: int) -> dict:
    pairs = make_pairs(verifier, n, seed)
    if verifier == "math":  # start the worker outside the timed loops
        compare("math", "1", "1")
        compare("math", "\\frac{1}{2}", "0.5")

    def extracted_loop():
        for _, extracted, ref, options in pairs:
            compare(verifier, extracted, ref, options=options)

    def raw_loop():
        for raw, _, ref, options in pairs:
            verify_response(verifier, raw, ref, options=options)

    extracted_best, extracted_median, extracted_cpu = _rate(extracted_loop, n, repeats)
    raw_best, raw_median, raw_cpu = _rate(raw_loop, n, repeats)
    decisions = [verify_response(verifier, raw, ref, options=options) for raw, _, ref, options in pairs]
    return {
        "verifier": verifier,
        "pairs": n,
        "extracted_best": extracted_best,
        "extracted_median": extracted_median,
        "extracted_cpu": extracted_cpu,
        "raw_cpu": raw_cpu,
        "raw_best": raw_best,
        "raw_median": raw_median,
        "match_rate": sum(d.match for d in decisions) / n,
        "no_answer_rate": sum(d.reason == "no_answer" for d in decisions) / n,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--math-pairs", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verifiers", nargs="+", default=["relaxed", "exact", "numeric", "mc", "math"])
    args = parser.parse_args(argv)
    rows = []
    for verifier in args.verifiers:
        n = args.math_pairs if verifier == "math" else args.pairs
        rows.append(bench(verifier, n, args.repeats, args.seed))
    columns = [
        "verifier",
        "pairs",
        "extracted pairs/s (best / median)",
        "raw pairs/s (best / median)",
        "per CPU-second (extracted / raw)",
        "match",
        "no_answer",
    ]
    table = [
        [
            r["verifier"],
            f"{r['pairs']:,}",
            f"{r['extracted_best']:,.0f} / {r['extracted_median']:,.0f}",
            f"{r['raw_best']:,.0f} / {r['raw_median']:,.0f}",
            f"{r['extracted_cpu']:,.0f} / {r['raw_cpu']:,.0f}",
            f"{r['match_rate']:.1%}",
            f"{r['no_answer_rate']:.1%}",
        ]
        for r in rows
    ]
    widths = [max(len(c), *(len(row[i]) for row in table)) for i, c in enumerate(columns)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in table:
        print(
            "| "
            + " | ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths)))
            + " |"
        )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"\n{os.cpu_count()} CPUs, load average {load:.1f} at the end (wall-clock rates drop when other processes run)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
