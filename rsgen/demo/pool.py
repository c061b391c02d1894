"""The procedural demo pool: CLEVR-Math-like scenes, small bar charts and multiple-choice questions, drawn with PIL.

Three families, so that every part of the pipeline has something to do without a download:

- ``CLEVRMath``: scenes of 3-10 objects (cube, sphere, cylinder; big/small; rubber/metal, also called matte/shiny;
  eight colours) with questions in CLEVR-Math's templates ("Subtract all big blue things. Subtract all large
  rubber objects. How many objects are left?", "Add 1 matte objects. How many objects exist?", counting).
- ``DemoChart``: bar charts; numeric answers read off the bars and text answers (which label is highest).
- ``DemoMC``: multiple-choice questions about CLEVR-like scenes. Options are flattened into prose
  ("... Options: red, blue, green."), written as a lettered block, or only given in the options column, and the
  answer is either the letter or the option text: the raw material of the prepare stage's MC normalisation.

Every answer is computed from a scene description (stored as JSON on each row) by a small interpreter of the
question text, `answer_from_scene`, so a test can recompute every answer. Generation is deterministic: image `i`
of seed `s` is drawn from its own random stream, so a pool is identical for the same seed and a smaller pool is a
prefix of a larger one.

Longer than most modules (~630 lines) on purpose: a demo image and its questions come from one seeded random
stream (scene, drawing, questions, in that order), and the truth that grades a run (`solve_from_scene`) sits beside
the question templates it must answer; split, the order of draws would be spread over files.
"""

from __future__ import annotations

import io
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

# 168 x 112 is a multiple of 28 (Qwen2-VL's patch 14 x merge 2), so the demo model sees 6 x 4 image tokens with no
# resampling; small objects stay a few pixels apart from each other.
IMAGE_WIDTH = 168
IMAGE_HEIGHT = 112
BACKGROUND = (218, 218, 212)

SOURCE = "rsgen-demo"
FAMILIES = ("CLEVRMath", "DemoChart", "DemoMC")
FAMILY_WEIGHTS = (0.6, 0.2, 0.2)

# CLEVR's palette.
COLORS = {
    "gray": (87, 87, 87),
    "red": (173, 35, 35),
    "blue": (42, 75, 215),
    "green": (29, 105, 20),
    "brown": (129, 74, 25),
    "purple": (129, 38, 192),
    "cyan": (41, 208, 208),
    "yellow": (255, 238, 51),
}
SHAPES = ("cube", "sphere", "cylinder")
SIZES = ("large", "small")
MATERIALS = ("rubber", "metal")
RADIUS = {"large": 11, "small": 6}
CELL = 28  # objects sit in distinct cells of this size (see _place_objects)

# Surface words CLEVR uses for each canonical value; the first one is what the interpreter reports.
SIZE_WORDS = {"big": "large", "large": "large", "small": "small", "tiny": "small"}
MATERIAL_WORDS = {
    "rubber": "rubber",
    "matte": "rubber",
    "metal": "metal",
    "shiny": "metal",
    "metallic": "metal",
}
SHAPE_NOUNS = {
    "cube": "cube", "cubes": "cube", "block": "cube", "blocks": "cube",
    "sphere": "sphere", "spheres": "sphere", "ball": "sphere", "balls": "sphere",
    "cylinder": "cylinder", "cylinders": "cylinder",
}  # fmt: skip
ANY_NOUNS = {"thing", "things", "object", "objects"}
SHAPE_PLURALS = {"cube": ["cubes", "blocks"], "sphere": ["spheres", "balls"], "cylinder": ["cylinders"]}
SHAPE_SINGULARS = {"cube": ["cube", "block"], "sphere": ["sphere", "ball"], "cylinder": ["cylinder"]}
SIZE_SURFACE = {"large": ["big", "large"], "small": ["small", "tiny"]}
MATERIAL_SURFACE = {"rubber": ["rubber", "matte"], "metal": ["metal", "shiny", "metallic"]}

# Chart labels keep one colour each, so a bar's label can be told from its colour as well as from its text.
CHART_LABELS = {
    "apple": (200, 40, 40),
    "plum": (120, 50, 170),
    "lime": (40, 150, 40),
    "lemon": (230, 200, 30),
    "berry": (40, 70, 200),
    "fig": (130, 80, 30),
}
CHART_MAX = 10

LETTERS = "ABCDEFGH"
_OPTIONS_PROSE = re.compile(r"^(?P<stem>.*?)\s*Options: (?P<opts>.+?)\.?$", re.S)
_OPTION_LINE = re.compile(r"^([A-H])\. (.+)$")


# ----------------------------------------------------------------------------------------------- descriptors


def parse_descriptor(phrase: str) -> dict[str, str]:
    """ "big blue things" -> {"size": "large", "color": "blue"}; "small metal sphere" -> {..., "shape": "sphere"}."""
    words = phrase.strip().lower().split()
    if not words:
        raise ValueError("empty object description")
    *modifiers, noun = words
    attrs: dict[str, str] = {}
    if noun in SHAPE_NOUNS:
        attrs["shape"] = SHAPE_NOUNS[noun]
    elif noun not in ANY_NOUNS:
        raise ValueError(f"unknown object noun {noun!r} in {phrase!r}")
    for word in modifiers:
        if word in SIZE_WORDS:
            key, value = "size", SIZE_WORDS[word]
        elif word in MATERIAL_WORDS:
            key, value = "material", MATERIAL_WORDS[word]
        elif word in COLORS:
            key, value = "color", word
        else:
            raise ValueError(f"unknown attribute word {word!r} in {phrase!r}")
        if key in attrs:
            raise ValueError(f"two {key} words in {phrase!r}")
        attrs[key] = value
    return attrs


def _matches(obj: dict, attrs: dict[str, str]) -> bool:
    for key, value in attrs.items():
        if key not in obj:
            # An object added by "Add 2 matte objects" has no colour; asking whether it is red has no answer.
            raise ValueError(f"the question asks for {key} of an added object whose {key} is unknown")
        if obj[key] != value:
            return False
    return True


def _phrase(rng: random.Random, attrs: dict[str, str], plural: bool = True) -> str:
    words = []
    if "size" in attrs:
        words.append(rng.choice(SIZE_SURFACE[attrs["size"]]))
    if "color" in attrs:
        words.append(attrs["color"])
    if "material" in attrs:
        words.append(rng.choice(MATERIAL_SURFACE[attrs["material"]]))
    if "shape" in attrs:
        words.append(rng.choice((SHAPE_PLURALS if plural else SHAPE_SINGULARS)[attrs["shape"]]))
    else:
        words.append(rng.choice(("things", "objects") if plural else ("thing", "object")))
    return " ".join(words)


def _random_descriptor(rng: random.Random, objects: list[dict], from_scene: bool = True) -> dict[str, str]:
    """Attributes of one scene object (so the set is not empty), 1-3 of them; or random ones when not from_scene."""
    if from_scene:
        source = rng.choice(objects)
    else:
        source = {"shape": rng.choice(SHAPES), "size": rng.choice(SIZES), "material": rng.choice(MATERIALS),
                  "color": rng.choice(list(COLORS))}  # fmt: skip
    keys = rng.sample(["size", "color", "material", "shape"], rng.choice((1, 1, 2, 2, 2, 3)))
    return {key: source[key] for key in keys}


# ----------------------------------------------------------------------------------------------- the interpreter


def solve_from_scene(
    scene: dict | str, question: str, options: list[str] | None = None
) -> tuple[str, list[str]]:
    """The answer to `question` about `scene`, and the reasoning steps that reach it (short sentences).

    For a multiple-choice question the answer is the correct option's text; the options come from the
    question (prose or lettered) or from `options`. Raises ValueError for a question it cannot answer.
    """
    if isinstance(scene, str):
        scene = json.loads(scene)
    stem, option_texts = mc_option_texts(question, options or [])
    kind = scene.get("kind")
    if kind == "clevr":
        answer, steps = _solve_clevr(scene["objects"], stem)
    elif kind == "chart":
        answer, steps = _solve_chart(scene["bars"], stem)
    else:
        raise ValueError(f"unknown scene kind {kind!r}")
    if option_texts:
        if option_texts.count(answer) != 1:
            raise ValueError(f"answer {answer!r} is not exactly one of the options {option_texts}")
    return answer, steps


def answer_from_scene(scene: dict | str, question: str, options: list[str] | None = None) -> str:
    """Recompute the answer to `question` from the scene description (option text for multiple choice)."""
    return solve_from_scene(scene, question, options)[0]


def mc_option_texts(question: str, options: list[str] | None = None) -> tuple[str, list[str]]:
    """Split a question into (stem, option texts): options given as a list, a lettered block, or prose."""
    if options:
        return question, list(options)
    lines = question.split("\n")
    lettered = [_OPTION_LINE.match(line.strip()) for line in lines]
    if any(lettered):
        first = next(i for i, m in enumerate(lettered) if m)
        found = [m for m in lettered[first:] if m]
        if len(found) != len(lines) - first or [m.group(1) for m in found] != list(LETTERS[: len(found)]):
            raise ValueError(f"malformed lettered options in {question!r}")
        return "\n".join(lines[:first]).strip(), [m.group(2).strip() for m in found]
    prose = _OPTIONS_PROSE.match(question)
    if prose:
        return prose.group("stem").strip(), [o.strip() for o in prose.group("opts").split(",")]
    return question, []


_SENTENCE = re.compile(r"[^.?]+[.?]")
_SUB_ALL = re.compile(r"^Subtract all (.+)\.$")
_SUB_N = re.compile(r"^Subtract (\d+) (.+)\.$")
_ADD_N = re.compile(r"^Add (\d+) (.+)\.$")
_HOW_MANY = re.compile(r"^How many (.+?) (?:are left|exist|are there)\?$")
_COLOR_OF = re.compile(r"^What color is the (.+)\?$")
_SHAPE_OF = re.compile(r"^What shape is the (.+)\?$")
_MATERIAL_OF = re.compile(r"^What material is the (.+)\?$")
_MOST_SHAPE = "Which shape appears most often?"


def _count_phrase(n: int, phrase: str) -> str:
    return f"{n} {phrase}"


def _solve_clevr(objects: list[dict], question: str) -> tuple[str, list[str]]:
    sentences = [s.strip() for s in _SENTENCE.findall(question.strip())]
    if not sentences or "".join(sentences).replace(" ", "") != question.strip().replace(" ", ""):
        raise ValueError(f"cannot split {question!r} into sentences")
    *operations, final = sentences

    if not operations:
        if final == _MOST_SHAPE:
            counts = {shape: sum(o["shape"] == shape for o in objects) for shape in SHAPES}
            top = max(counts.values())
            winners = [shape for shape, c in counts.items() if c == top]
            if len(winners) != 1:
                raise ValueError("no single most frequent shape")
            listing = ", ".join(f"{counts[s]} {SHAPE_PLURALS[s][0]}" for s in SHAPES)
            return winners[0], [f"There are {listing}."]
        for pattern, key in ((_COLOR_OF, "color"), (_SHAPE_OF, "shape"), (_MATERIAL_OF, "material")):
            m = pattern.match(final)
            if m:
                attrs = parse_descriptor(m.group(1))
                found = [o for o in objects if _matches(o, attrs)]
                if len(found) != 1:
                    raise ValueError(
                        f"{len(found)} objects match {m.group(1)!r}; the question needs exactly one"
                    )
                value = found[0][key]
                return value, [f"The {m.group(1)} is {value}."]

    m = _HOW_MANY.match(final)
    if not m:
        raise ValueError(f"unknown question {final!r}")
    target_phrase, target = m.group(1), parse_descriptor(m.group(1))

    def count(objs: list[dict]) -> int:
        return sum(_matches(o, target) for o in objs)

    # The steps count in the asked-for set ("objects", or e.g. "red cubes"), one sentence per operation.
    state = [dict(o) for o in objects]
    steps = [f"There are {_count_phrase(count(state), target_phrase)}."]
    for sentence in operations:
        if m := _SUB_ALL.match(sentence):
            attrs = parse_descriptor(m.group(1))
            removed = [o for o in state if _matches(o, attrs)]
            state = [o for o in state if not _matches(o, attrs)]
            steps.append(f"Subtract {_count_phrase(count(removed), m.group(1))}: {count(state)} left.")
        elif m := _SUB_N.match(sentence):
            n, attrs = int(m.group(1)), parse_descriptor(m.group(2))
            matching = [i for i, o in enumerate(state) if _matches(o, attrs)]
            if len(matching) < n:
                raise ValueError(f"cannot subtract {n} {m.group(2)}: only {len(matching)} present")
            drop = set(matching[:n])
            state = [o for i, o in enumerate(state) if i not in drop]
            steps.append(f"Subtract {n}: {count(state)} left.")
        elif m := _ADD_N.match(sentence):
            n, attrs = int(m.group(1)), parse_descriptor(m.group(2))
            state.extend(dict(attrs) for _ in range(n))
            steps.append(f"Add {n}: {count(state)}.")
        else:
            raise ValueError(f"unknown operation {sentence!r}")
    return str(count(state)), steps


_CHART_VALUE = re.compile(r"^What is the value of (\w+)\?$")
_CHART_SUM = re.compile(r"^What is the sum of (\w+) and (\w+)\?$")
_CHART_DIFF = re.compile(r"^What is the difference between (\w+) and (\w+)\?$")
_CHART_EXTREME = re.compile(r"^Which fruit has the (highest|lowest) value\?$")
_CHART_BARS = "How many bars are there?"


def _solve_chart(bars: list[dict], question: str) -> tuple[str, list[str]]:
    values = {bar["label"]: bar["value"] for bar in bars}

    def value_of(label: str) -> int:
        if label not in values:
            raise ValueError(f"no bar labelled {label!r}")
        return values[label]

    question = question.strip()
    if m := _CHART_VALUE.match(question):
        v = value_of(m.group(1))
        return str(v), [f"The {m.group(1)} bar reaches {v}."]
    if m := _CHART_SUM.match(question):
        a, b = value_of(m.group(1)), value_of(m.group(2))
        return str(a + b), [f"{m.group(1)} is {a} and {m.group(2)} is {b}; {a} + {b} = {a + b}."]
    if m := _CHART_DIFF.match(question):
        a, b = value_of(m.group(1)), value_of(m.group(2))
        hi, lo = max(a, b), min(a, b)
        return str(hi - lo), [f"{m.group(1)} is {a} and {m.group(2)} is {b}; {hi} - {lo} = {hi - lo}."]
    if m := _CHART_EXTREME.match(question):
        pick = max if m.group(1) == "highest" else min
        target = pick(values.values())
        winners = [label for label, v in values.items() if v == target]
        if len(winners) != 1:
            raise ValueError(f"no single {m.group(1)} bar")
        word = "tallest" if m.group(1) == "highest" else "shortest"
        return winners[0], [f"The {word} bar is {winners[0]} at {target}."]
    if question == _CHART_BARS:
        return str(len(bars)), [f"I count {len(bars)} bars."]
    raise ValueError(f"unknown chart question {question!r}")


# ----------------------------------------------------------------------------------------------- drawing


def _place_objects(rng: random.Random, count: int) -> list[dict]:
    """Objects in distinct cells of a 6 x 4 grid of 28-pixel cells, jittered inside their cell.

    The cells are the demo model's image tokens (patch 14, merged 2 x 2), so no two objects share a token and a
    count is a count of tokens: what makes counting learnable for a model of a few MB. To the eye the objects
    still look scattered.
    """
    columns, rows = IMAGE_WIDTH // CELL, IMAGE_HEIGHT // CELL
    objects = []
    for cell in rng.sample(range(columns * rows), count):
        size = rng.choice(SIZES)
        slack = CELL // 2 - RADIUS[size] - 1
        x = (cell % columns) * CELL + CELL // 2 + rng.randint(-slack, slack)
        y = (cell // columns) * CELL + CELL // 2 + rng.randint(-slack, slack)
        objects.append({"shape": rng.choice(SHAPES), "size": size, "material": rng.choice(MATERIALS),
                        "color": rng.choice(list(COLORS)), "x": x, "y": y})  # fmt: skip
    return objects


def _shade(rgb: tuple[int, int, int], factor: float) -> tuple[int, int, int]:
    if factor >= 1:
        return tuple(int(c + (255 - c) * (factor - 1)) for c in rgb)
    return tuple(int(c * factor) for c in rgb)


def draw_clevr(objects: list[dict]) -> Image.Image:
    """Flat CLEVR: cubes are squares, spheres circles, cylinders boxes with an elliptic top; metal gets a highlight."""
    image = Image.new("RGB", (IMAGE_WIDTH, IMAGE_HEIGHT), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for o in sorted(objects, key=lambda o: o["y"]):  # back to front
        r, x, y = RADIUS[o["size"]], o["x"], o["y"]
        fill = COLORS[o["color"]]
        metal = o["material"] == "metal"
        outline = (20, 20, 20) if metal else _shade(fill, 0.6)
        box = (x - r, y - r, x + r, y + r)
        if o["shape"] == "cube":
            draw.rectangle(box, fill=fill, outline=outline)
        elif o["shape"] == "sphere":
            draw.ellipse(box, fill=fill, outline=outline)
        else:
            cap = max(2, r // 2)
            draw.rectangle((x - r, y - r + cap, x + r, y + r), fill=fill, outline=outline)
            draw.ellipse((x - r, y - r, x + r, y - r + 2 * cap), fill=_shade(fill, 1.35), outline=outline)
        if metal:
            h = max(1, r // 4)
            draw.ellipse(
                (x - r // 2 - h, y - r // 2 - h, x - r // 2 + h, y - r // 2 + h), fill=(255, 255, 255)
            )
    return image


_FONT: ImageFont.ImageFont | ImageFont.FreeTypeFont | None = None


def _font():
    global _FONT
    if _FONT is None:
        _FONT = ImageFont.load_default(size=9)
    return _FONT


def draw_chart(bars: list[dict]) -> Image.Image:
    image = Image.new("RGB", (IMAGE_WIDTH, IMAGE_HEIGHT), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    font = _font()
    left, right, top, bottom = 20, IMAGE_WIDTH - 4, 6, IMAGE_HEIGHT - 16
    scale = (bottom - top) / CHART_MAX
    for tick in range(0, CHART_MAX + 1, 2):
        y = bottom - tick * scale
        draw.line((left, y, right, y), fill=(225, 225, 225))
        draw.text((2, y - 5), str(tick), fill=(60, 60, 60), font=font)
    draw.line((left, top, left, bottom), fill=(0, 0, 0))
    draw.line((left, bottom, right, bottom), fill=(0, 0, 0))
    slot = (right - left) / len(bars)
    for i, bar in enumerate(bars):
        x0 = left + i * slot + slot * 0.2
        x1 = left + (i + 1) * slot - slot * 0.2
        draw.rectangle((x0, bottom - bar["value"] * scale, x1, bottom), fill=tuple(bar["color"]))
        width = draw.textlength(bar["label"], font=font)
        draw.text((left + (i + 0.5) * slot - width / 2, bottom + 3), bar["label"], fill=(0, 0, 0), font=font)
    return image


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()


# ----------------------------------------------------------------------------------------------- questions


def _clevr_questions(rng: random.Random, objects: list[dict], count: int) -> list[str]:
    questions: list[str] = []
    attempts = 0
    while len(questions) < count and attempts < 50:
        attempts += 1
        kind = rng.choices(
            ("count_all", "count", "sub", "sub2", "add", "sub_n", "add_same"), weights=(1, 2, 3, 3, 2, 1, 1)
        )[0]
        if kind == "count_all":
            q = "How many objects are there?"
        elif kind == "count":
            q = f"How many {_phrase(rng, _random_descriptor(rng, objects, rng.random() < 0.8))} are there?"
        elif kind == "sub":
            q = f"Subtract all {_phrase(rng, _random_descriptor(rng, objects, rng.random() < 0.85))}. "
            q += "How many objects are left?"
        elif kind == "sub2":
            first = _phrase(rng, _random_descriptor(rng, objects, rng.random() < 0.85))
            second = _phrase(rng, _random_descriptor(rng, objects, rng.random() < 0.85))
            q = f"Subtract all {first}. Subtract all {second}. How many objects are left?"
        elif kind == "add":
            n = rng.randint(1, 3)
            q = f"Add {n} {_phrase(rng, _random_descriptor(rng, objects, rng.random() < 0.5))}. How many objects exist?"
        elif kind == "sub_n":
            attrs = _random_descriptor(rng, objects)
            present = sum(_matches(o, attrs) for o in objects)
            n = rng.randint(1, present)
            phrase = _phrase(rng, attrs)
            target = phrase if rng.random() < 0.5 else "objects"
            q = f"Subtract {n} {phrase}. How many {target} are left?"
        else:
            n = rng.randint(1, 3)
            phrase = _phrase(rng, _random_descriptor(rng, objects, rng.random() < 0.7))
            q = f"Add {n} {phrase}. How many {phrase} exist?"
        if q not in questions:
            questions.append(q)
    return questions


def _chart_questions(rng: random.Random, bars: list[dict], count: int) -> list[str]:
    labels = [bar["label"] for bar in bars]
    values = [bar["value"] for bar in bars]
    candidates = [f"What is the value of {label}?" for label in labels]
    a, b = rng.sample(labels, 2)
    candidates += [
        f"What is the sum of {a} and {b}?",
        f"What is the difference between {a} and {b}?",
        _CHART_BARS,
    ]
    if values.count(max(values)) == 1:
        candidates.append("Which fruit has the highest value?")
    if values.count(min(values)) == 1:
        candidates.append("Which fruit has the lowest value?")
    return rng.sample(candidates, min(count, len(candidates)))


def _unique_description(rng: random.Random, objects: list[dict], target: dict, asked: str) -> str | None:
    """The shortest attribute set (never the asked attribute) that picks out `target` alone, as a singular phrase."""
    others = [k for k in ("shape", "size", "material", "color") if k != asked]
    subsets = (
        [[k] for k in others] + [[a, b] for i, a in enumerate(others) for b in others[i + 1 :]] + [others]
    )
    for keys in subsets:
        attrs = {k: target[k] for k in keys}
        if sum(_matches(o, attrs) for o in objects) == 1:
            return _phrase(rng, attrs, plural=False)
    return None


def _mc_questions(rng: random.Random, objects: list[dict], count: int) -> list[tuple[str, list[str]]]:
    """(stem, option texts) pairs; the correct answer is recomputed from the scene, so it is not returned here."""
    out: list[tuple[str, list[str]]] = []
    for _ in range(30):
        if len(out) >= count:
            break
        kind = rng.choice(("color", "shape", "material", "most_shape", "count"))
        if kind in ("color", "shape", "material"):
            target = rng.choice(objects)
            description = _unique_description(rng, objects, target, kind)
            if description is None:
                continue
            stem = f"What {kind} is the {description}?"
            pool = {"color": list(COLORS), "shape": list(SHAPES), "material": list(MATERIALS)}[kind]
            wrong = rng.sample([v for v in pool if v != target[kind]], min(3, len(pool) - 1))
            options = [target[kind], *wrong]
        elif kind == "most_shape":
            counts = [sum(o["shape"] == s for o in objects) for s in SHAPES]
            if counts.count(max(counts)) != 1:
                continue
            stem, options = _MOST_SHAPE, list(SHAPES)
        else:
            attrs = _random_descriptor(rng, objects)
            right = sum(_matches(o, attrs) for o in objects)
            stem = f"How many {_phrase(rng, attrs)} are there?"
            wrong = rng.sample([v for v in range(0, 11) if v != right], 3)
            options = [str(v) for v in (right, *wrong)]
        rng.shuffle(options)
        if stem not in (s for s, _ in out):
            out.append((stem, options))
    return out


def _format_mc(rng: random.Random, stem: str, options: list[str]) -> tuple[str, list[str]]:
    """Options flattened into prose, as a lettered block, or only in the options column."""
    style = rng.choice(("prose", "lettered", "column"))
    if style == "prose":
        return f"{stem} Options: {', '.join(options)}.", []
    if style == "lettered":
        return stem + "\n" + "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options)), []
    return stem, list(options)


# ----------------------------------------------------------------------------------------------- the pool


def _image_rng(seed: int, index: int) -> random.Random:
    # String seeds hash with SHA-512: stable across processes and Python versions, unlike hash().
    return random.Random(f"rsgen-demo:{seed}:{index}")


def make_demo_image(seed: int, index: int) -> tuple[str, bytes, dict, list[tuple[str, str, list[str]]]]:
    """One image of the pool: (family, PNG bytes, scene, [(question, answer, options), ...])."""
    rng = _image_rng(seed, index)
    family = rng.choices(FAMILIES, weights=FAMILY_WEIGHTS)[0]
    num_questions = rng.randint(3, 5)
    qas: list[tuple[str, str, list[str]]] = []
    if family == "DemoChart":
        labels = rng.sample(list(CHART_LABELS), rng.randint(3, 5))
        bars = [
            {"label": lb, "value": rng.randint(1, CHART_MAX), "color": list(CHART_LABELS[lb])}
            for lb in labels
        ]
        scene = {"kind": "chart", "bars": bars, "y_max": CHART_MAX}
        image = draw_chart(bars)
        for q in _chart_questions(rng, bars, num_questions):
            qas.append((q, answer_from_scene(scene, q), []))
    else:
        objects = _place_objects(rng, rng.randint(3, 10))
        scene = {"kind": "clevr", "objects": objects}
        image = draw_clevr(objects)
        if family == "CLEVRMath":
            for q in _clevr_questions(rng, objects, num_questions):
                qas.append((q, answer_from_scene(scene, q), []))
        else:
            for stem, options in _mc_questions(rng, objects, num_questions):
                question, column = _format_mc(rng, stem, options)
                text = answer_from_scene(scene, question, column)
                answer = LETTERS[options.index(text)] if rng.random() < 0.5 else text
                qas.append((question, answer, column))
    scene = {**scene, "width": IMAGE_WIDTH, "height": IMAGE_HEIGHT}
    return family, _png(image), scene, qas


def make_demo_rows(num_images: int, seed: int) -> Iterator[dict]:
    """Rows of the demo pool, one per QA pair (several per image), in a fixed order.

    Each row: image (PNG bytes), question, answer (str), options (list[str], may be empty), family, source,
    source_id ("{seed}/{image index}/{question index}") and scene (JSON of the scene the answer is computed from).
    """
    if num_images < 0:
        raise ValueError(f"num_images must be >= 0, got {num_images}")
    for index in range(num_images):
        family, png, scene, qas = make_demo_image(seed, index)
        scene_json = json.dumps(scene, sort_keys=True)
        for q_index, (question, answer, options) in enumerate(qas):
            yield {
                "image": png,
                "question": question,
                "answer": answer,
                "options": options,
                "family": family,
                "source": SOURCE,
                "source_id": f"{seed}/{index}/{q_index}",
                "scene": scene_json,
            }


def demo_features():
    from datasets import Features, Image, List, Value

    return Features(
        {
            "image": Image(),
            "question": Value("string"),
            "answer": Value("string"),
            "options": List(Value("string")),
            "family": Value("string"),
            "source": Value("string"),
            "source_id": Value("string"),
            "scene": Value("string"),
        }
    )


def write_demo_pool(path: str | Path, num_images: int, seed: int, rows_per_row_group: int = 10_000) -> Path:
    """Write the pool as one parquet file that `datasets.load_dataset("parquet", ...)` reads with an Image column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    features = demo_features()
    schema = (
        features.arrow_schema
    )  # carries the `datasets` features in its metadata, so `image` decodes as Image
    tmp = path.with_name(path.name + ".tmp")
    with pq.ParquetWriter(tmp, schema) as writer:
        batch: list[dict] = []
        for row in make_demo_rows(num_images, seed):
            batch.append({**row, "image": {"bytes": row["image"], "path": None}})
            if len(batch) >= rows_per_row_group:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    tmp.replace(path)
    return path
