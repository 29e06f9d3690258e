"""Built-in chat prompts for training a head of an instruction-tuned target (``--prompts instructions``).

A head learns what its target writes, so its training prompts should ask for what users ask: writing, role play,
reasoning, arithmetic, code, extraction, science and humanities questions (MT-bench's eight categories) and code
completion (HumanEval's task). They must also be **disjoint from every benchmark prompt**, so none is taken from a
benchmark: every prompt here is built from two sources only:

- the running interpreter's **standard library** (`fastspec.prompts.training_files`): function
  signatures with their docstrings to complete or implement, short function bodies to explain, review, annotate or
  rewrite, and docstring paragraphs to summarise or mine for names (extraction);
- **templates written here** over topic lists written here: short writing tasks, role plays, explanations and
  comparisons of science and humanities topics, and seeded generated puzzles (orderings, syllogisms) and arithmetic
  word problems with random names and numbers.

`instruction_prompts(count, seed)` returns ``count`` single-turn chat prompts (``[{"role": "user", "content":
...}]``) in a seeded order that interleaves the kinds round-robin, so any prefix is balanced and the first n do not
depend on ``count`` (the regeneration cache extends rather than regenerates).
"""

from __future__ import annotations

import ast
import random
import textwrap

__all__ = ["INSTRUCTION_KINDS", "instruction_prompts"]

# fmt: off
_SCIENCE = [
    "photosynthesis", "plate tectonics", "the water cycle", "black holes", "vaccines", "DNA replication",
    "electric circuits", "the greenhouse effect", "entropy", "natural selection", "the immune system", "tides",
    "semiconductors", "nuclear fission", "ocean currents", "the speed of sound", "antibiotics", "volcanoes",
    "the periodic table", "magnetism", "climate feedback loops", "enzymes", "the nitrogen cycle", "lasers",
    "earthquakes", "solar panels", "batteries", "neurons", "rainbows", "friction", "gravity on the Moon",
    "compilers", "hash tables", "public-key cryptography", "machine learning", "binary numbers", "recursion",
    "databases", "operating systems", "the internet's routing", "sorting algorithms", "floating-point numbers",
]
_HUMANITIES = [
    "the printing press", "the Silk Road", "the Renaissance", "ancient Greek theatre", "the Industrial Revolution",
    "jazz", "impressionist painting", "the Roman Republic", "world religions' festivals", "epic poetry",
    "the history of money", "urbanisation", "the invention of writing", "classical music", "democracy",
    "the history of maps", "folk tales", "architecture of cathedrals", "the history of chess", "linguistics",
    "philosophy of ethics", "the history of medicine", "colonial trade", "the scientific method's history",
    "the history of photography", "film as an art form", "human rights", "museums", "translation", "mythology",
]
_EVERYDAY = [
    "saving money", "learning a language", "staying focused", "cooking for one", "moving to a new city",
    "starting to run", "keeping a garden", "public speaking", "remote work", "sleeping better", "travel on a budget",
    "writing a resume", "caring for a dog", "reducing waste at home", "planning a wedding", "learning to code",
    "making friends as an adult", "time management", "preparing for an exam", "buying a used car",
]
_FORMS = [
    "a short poem", "a short story", "a blog post introduction", "a product description", "a friendly email",
    "a haiku", "a persuasive paragraph", "a news headline and first paragraph", "a limerick", "a diary entry",
    "a speech opening", "a dialogue between two friends",
]
_ROLES = [
    ("a museum guide", "describe {t} to a group of visitors"),
    ("a science teacher", "explain {t} to a class of twelve-year-olds"),
    ("a travel blogger", "describe a trip inspired by {t}"),
    ("a personal coach", "give me advice about {e}"),
    ("a chef", "explain how you would plan a dinner around {e}"),
    ("a detective", "explain how {t} helped you solve a case"),
    ("a news reporter", "report on a breakthrough related to {t}"),
    ("a historian", "tell me a story about {h}"),
    ("a librarian", "recommend how to learn about {h}"),
    ("a software engineer", "explain {s} to a new colleague"),
]
_NAMES = ["Alice", "Bob", "Carol", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kim", "Leo",
          "Maya", "Nina", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara"]
_ITEMS = [("pencils", "pencil"), ("apples", "apple"), ("books", "book"), ("tickets", "ticket"),
          ("notebooks", "notebook"), ("cups of coffee", "cup"), ("bus rides", "ride"), ("plants", "plant")]
# fmt: on


def _functions(files, limit_lines: int = 30):
    """``(name, signature line, docstring, source)`` of the documented top-level functions and methods of ``files``
    (their first line of code at most 120 characters, bodies of at most ``limit_lines`` lines)."""
    out = []
    for path in files:
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 40 or node.end_lineno - node.lineno > limit_lines:
                continue
            header = lines[node.lineno - 1].strip()
            if not header.endswith(":") or len(header) > 120:
                continue
            body = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
            out.append((node.name, header, doc, body))
    return out


def _code_prompts(functions) -> list[str]:
    asks = []
    for name, header, doc, body in functions:
        summary = doc.strip().split("\n\n")[0].replace("\n", " ")
        stub = f'{header}\n    """{textwrap.indent(doc.strip(), "    ").strip()}\n    """\n'
        asks.append(f"Complete this Python function.\n\n```python\n{stub}```")
        asks.append(f"Write a Python function `{name}` that does the following: {summary}")
        asks.append(f"Explain what this Python function does, step by step.\n\n```python\n{body}\n```")
        asks.append(f"Review this Python code and suggest improvements.\n\n```python\n{body}\n```")
        asks.append(f"Add type hints and comments to this function.\n\n```python\n{body}\n```")
        asks.append(f"Write unit tests with pytest for this function.\n\n```python\n{body}\n```")
    return asks


def _extraction_prompts(functions) -> list[str]:
    asks = []
    for _, _, doc, _ in functions:
        text = " ".join(doc.split())
        if len(text) < 200:
            continue
        text = text[:900]
        asks.append(f"Summarise the following text in two sentences.\n\n{text}")
        asks.append(f"List every technical term that appears in this text, one per line.\n\n{text}")
        asks.append(f"Turn this text into three questions with their answers.\n\n{text}")
        asks.append(f"Extract the key facts from this text as a JSON object.\n\n{text}")
    return asks


def _reasoning(rng: random.Random) -> str:
    kind = rng.randrange(3)
    a, b, c, d = rng.sample(_NAMES, 4)
    if kind == 0:
        return (f"{a} is taller than {b}. {c} is shorter than {b} but taller than {d}. Who is the tallest and who "
                f"is the shortest? Explain your reasoning.")  # fmt: skip
    if kind == 1:
        thing = rng.choice(["cats", "teachers", "runners", "painters", "engineers"])
        trait = rng.choice(["curious", "patient", "early risers", "left-handed", "musicians"])
        return (f"All {thing} in the club are {trait}. {a} is in the club and is one of the {thing}. Is {a} "
                f"{trait}? What if {b} is {trait} but not in the club? Answer carefully.")  # fmt: skip
    n = rng.randint(3, 6)
    return (f"{a}, {b} and {c} stand in a line. {a} is not first, {b} is directly behind {c}, and there are {n} "
            f"people in the room in total. In what order are the three standing? Explain each step.")  # fmt: skip


def _math(rng: random.Random) -> str:
    kind = rng.randrange(4)
    name = rng.choice(_NAMES)
    items, item = rng.choice(_ITEMS)
    if kind == 0:
        price, count, paid = rng.randint(2, 9), rng.randint(3, 12), 100
        return (f"{name} buys {count} {items} at ${price} per {item} and pays with ${paid}. How much change does "
                f"{name} get? Show your work.")  # fmt: skip
    if kind == 1:
        a, x, b = rng.randint(2, 9), rng.randint(1, 20), rng.randint(1, 30)
        return f"Solve for x: {a}x + {b} = {a * x + b}. Explain each step."
    if kind == 2:
        pct, total = rng.choice([10, 15, 20, 25, 30, 40]), rng.randint(4, 60) * 10
        return f"What is {pct}% of {total}? Then explain how to compute percentages in your head."
    w, h = rng.randint(3, 25), rng.randint(3, 25)
    return (f"A rectangle is {w} cm wide and {h} cm tall. What are its area and perimeter? Then say how they "
            f"change if both sides double.")  # fmt: skip


def _writing(rng: random.Random) -> str:
    topic = rng.choice(_SCIENCE + _HUMANITIES + _EVERYDAY)
    return f"Write {rng.choice(_FORMS)} about {topic}."


def _roleplay(rng: random.Random) -> str:
    role, task = rng.choice(_ROLES)
    task = task.format(t=rng.choice(_SCIENCE + _HUMANITIES), e=rng.choice(_EVERYDAY), h=rng.choice(_HUMANITIES),
                       s=rng.choice(_SCIENCE[-12:]))  # fmt: skip
    return f"Pretend you are {role}. In character, {task}."


def _stem(rng: random.Random) -> str:
    a, b = rng.sample(_SCIENCE, 2)
    return rng.choice([f"Explain {a} in simple terms.", f"What is the difference between {a} and {b}?",
                       f"What are common misconceptions about {a}?", f"How is {a} used in everyday life?"])  # fmt: skip


def _humanities(rng: random.Random) -> str:
    a, b = rng.sample(_HUMANITIES, 2)
    return rng.choice([f"Discuss how {a} changed society.", f"Compare {a} and {b}.",
                       f"Why do people still study {a} today?", f"Write a short essay on {a}."])  # fmt: skip


def _advice(rng: random.Random) -> str:
    topic = rng.choice(_EVERYDAY)
    return rng.choice([f"Give me five tips for {topic}.", f"What are the pros and cons of {topic}?",
                       f"Make a one-week plan for {topic}."])  # fmt: skip


INSTRUCTION_KINDS = ("code", "extraction", "writing", "roleplay", "reasoning", "math", "stem", "humanities", "advice")
_GENERATED = {"writing": _writing, "roleplay": _roleplay, "reasoning": _reasoning, "math": _math, "stem": _stem,
              "humanities": _humanities, "advice": _advice}  # fmt: skip


def instruction_prompts(count: int, seed: int = 0) -> list[list[dict]]:
    """``count`` single-turn chat prompts (module docstring), kinds interleaved in `INSTRUCTION_KINDS` order."""
    from fastspec.prompts import training_files

    if count < 1:
        raise ValueError(f"max_prompts: must be >= 1 for the instruction prompts, got {count}")
    rng = random.Random(seed)
    functions = _functions(training_files())
    rng.shuffle(functions)
    code = _code_prompts(functions)
    extraction = _extraction_prompts(functions)
    rng.shuffle(code)
    rng.shuffle(extraction)
    streams = {"code": iter(code), "extraction": iter(extraction)}
    prompts: list[str] = []
    seen: set[str] = set()
    while len(prompts) < count:
        before = len(prompts)
        for kind in INSTRUCTION_KINDS:
            if kind in streams:
                text = next(streams[kind], None)
            else:
                text = next((t for t in (_GENERATED[kind](rng) for _ in range(20)) if t not in seen), None)
            if text is not None and text not in seen:
                seen.add(text)
                prompts.append(text)
                if len(prompts) == count:
                    break
        if len(prompts) == before:
            raise ValueError(f"max_prompts: only {len(prompts)} distinct instruction prompts, asked for {count}")
    return [[{"role": "user", "content": text}] for text in prompts]
