"""Compile asyncroll's per-turn JSON schemas with the grammar engines of vLLM and SGLang, and check that
each engine enforces them.

``python scripts/grammar_check.py [WORKLOAD.jsonl ...]`` needs the engines, which asyncroll does not
depend on: ``pip install 'xgrammar>=0.2' 'llguidance>=1' 'outlines-core>=0.2'`` (CPU wheels; an engine
that is not installed is skipped). For each distinct schema — the turns of the given workloads, and a
tool of every declared input type — each engine compiles it as vLLM does (xgrammar
``compile_json_schema`` with any whitespace, llguidance ``grammar_from_json_schema`` + ``validate_grammar``,
outlines-core ``build_regex_from_schema`` + ``Index``), then its matcher is fed a valid action and
actions the schema forbids (wrong tool name, wrong argument type, a bad ``dict[int, int]`` key, extra or
missing keys, a final where a tool call is due). asyncroll's own validation says which are valid. A
line per schema and engine: ``ok``, ``REFUSED`` (a request would get 400), or the forbidden actions the
engine let through (the constraint is not enforced; asyncroll then fails the reply as
``invalid_action``). Exit status 1 when any engine refuses or lets something through.

The vocabulary is one token per byte, so acceptance is the grammar's, not a tokenizer's. Engines fix the
order of an object's keys and may refuse some string escapes (``\\u00e9``); a valid action is written as
asyncroll's ``json.dumps(..., ensure_ascii=False)``, in the schema's key order, so that neither counts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from asyncroll.backends.action_schema import schema_errors, turn_schema
from asyncroll.coerce import TYPE_NAMES
from asyncroll.errors import WorkloadError
from asyncroll.workload import Problem, iter_problems

EOS = 256
#: A valid value, and values the schema forbids, of each declared input type (spaces removed).
GOOD: dict[str, Any] = {
    "str": "hi",
    "int": 3,
    "float": 2.5,
    "bool": True,
    "number": 4,
    "dict[int,int]": {"1": 2, "-30": 0},
    "list[int]": [1, -2],
    "List[int]": [7],
    "list[float]": [1.5, 2],
    "List[float]": [],
    "list[list[int]]": [[1, 2], []],
    "List[List[int]]": [[0]],
    "list[list[float]]": [[1.5, 2], [0]],
    "List[List[float]]": [],
}
BAD: dict[str, list[Any]] = {
    "str": [5],
    "int": ["3", 2.5, True],
    "float": ["x", True],
    "bool": [1],
    "number": ["5", None],
    "dict[int,int]": [{"a": 1}, {"07": 1}, {"-0": 1}, {"1": "x"}, {"1": 1.5}, [1]],
    "list[int]": [[1.5], ["a"]],
    "List[int]": [3],
    "list[float]": [["a"]],
    "List[float]": [[True]],
    "list[list[int]]": [[1, 2], [[1.5]]],
    "List[List[int]]": [[["a"]]],
    "list[list[float]]": [[[True]], [1.5]],
    "List[List[float]]": [[[[1.0]]]],
}


def engines() -> dict[str, tuple[Callable[[str], Any], Callable[[Any, str], bool]]]:
    """name → (compile a schema, or raise; does the compiled grammar accept this text?)"""
    found: dict[str, tuple[Callable[[str], Any], Callable[[Any, str], bool]]] = {}
    vocab = [bytes([i]) for i in range(256)]
    try:
        import xgrammar as xgr

        info = xgr.TokenizerInfo([*vocab, b"</s>"], vocab_type=xgr.VocabType.RAW, stop_token_ids=[EOS])
        compiler = xgr.GrammarCompiler(info, cache_enabled=False)

        def xgr_accepts(compiled: Any, text: str) -> bool:
            matcher = xgr.GrammarMatcher(compiled)
            return all(matcher.accept_token(token) for token in [*text.encode(), EOS])

        found[f"xgrammar {version('xgrammar')}"] = (
            lambda s: compiler.compile_json_schema(s, any_whitespace=True),
            xgr_accepts,
        )
    except ImportError:
        pass
    try:
        import llguidance as llg

        class Bytes:
            eos_token_id, bos_token_id, tokens, special_token_ids = EOS, None, [*vocab, b"</s>"], [EOS]

            def __call__(self, s: bytes) -> list[int]:
                return list(s)

        tok = llg.LLTokenizer(llg.TokenizerWrapper(Bytes()))

        def llg_compile(schema: str) -> str:
            grammar: str = llg.LLMatcher.grammar_from_json_schema(
                schema, defaults={"whitespace_flexible": True}
            )
            if error := llg.LLMatcher.validate_grammar(grammar, tok):
                raise ValueError(error)
            return grammar

        def llg_accepts(grammar: str, text: str) -> bool:
            matcher = llg.LLMatcher(tok, grammar, log_level=0)
            return bool(matcher.consume_tokens(list(text.encode()))) and matcher.is_accepting()

        found[f"llguidance {version('llguidance')}"] = (llg_compile, llg_accepts)
    except ImportError:
        pass
    try:
        import outlines_core as oc

        oc_vocab = oc.Vocabulary(EOS, {bytes([i]): [i] for i in range(256)})

        def oc_accepts(index: Any, text: str) -> bool:
            guide, tokens = oc.Guide(index), list(text.encode())
            if not guide.accepts_tokens(tokens):
                return False
            for token in tokens:
                guide.advance(token)
            return bool(guide.is_finished())

        found[f"outlines-core {version('outlines_core')}"] = (
            lambda s: oc.Index(oc.json_schema.build_regex_from_schema(s), oc_vocab),
            oc_accepts,
        )
    except ImportError:
        pass
    return found


def cases(problem: Problem, turn: int) -> list[tuple[str, Any]]:
    """(what, action) for one turn: a valid action first, then ones the schema forbids."""
    if problem.protocol == "one_repair":
        return [
            ("submit", {"type": "submit", "code": "print(1)"}),
            ("final", {"type": "final", "answer": "1"}),
        ]
    final = {"type": "final", "answer": "5"}
    if turn > 0 or not problem.tools:
        return [
            ("final", final),
            ("answer not a string", {**final, "answer": 5}),
            ("extra key", {**final, "x": 1}),
            ("tool call", {"type": "tool", "name": "add", "arguments": {"a": 1, "b": 2}}),
        ]
    out: list[tuple[str, Any]] = []
    for tool in problem.tools:
        types = {
            n: t.replace(" ", "") for n, t in tool.declared_inputs.items() if n not in tool.bound_arguments
        }
        args = {n: GOOD[t] for n, t in types.items()}
        call = {"type": "tool", "name": tool.name, "arguments": args}
        out += [(f"call {tool.name}", call), ("wrong tool name", {**call, "name": tool.name + "_x"})]
        out += [
            (f"{t} = {json.dumps(b)}", {**call, "arguments": {**args, n: b}})
            for n, t in types.items()
            for b in BAD[t]
        ]
        out += [("extra argument", {**call, "arguments": {**args, "zz": 1}}), ("extra key", {**call, "x": 1})]
        out += [("missing argument", {**call, "arguments": dict(list(args.items())[1:])})] if args else []
    return [*out, ("final on a tool turn", final)]


def feature_problems() -> list[tuple[str, Problem]]:
    """A tool of every declared input type beside one with a bound input and one with none; a lone
    ``dict[int, int]`` tool; a code problem."""
    every = {"name": "f", "implementation": "t.py", "inputs": {f"x{i}": t for i, t in enumerate(TYPE_NAMES)}}
    bound = {"name": "g", "implementation": "t.py", "inputs": {"n": "int", "k": "float"}}
    none = {"name": "h", "implementation": "t.py", "inputs": {}}
    counts = {"name": "counts", "implementation": "t.py", "inputs": {"c": "dict[int, int]"}}
    sets = {"every input type": [every, {**bound, "bound_arguments": {"k": 1}}, none], "one map": [counts]}
    out = [(label, Problem.model_validate({"prompt": "p", "tools": tools})) for label, tools in sets.items()]
    code = {"prompt": "p", "metadata": {"prompt_metadata": {"protocol": "one_repair"}}}
    return [*out, ("code", Problem.model_validate(code))]


def main(paths: list[str]) -> int:
    if {"-h", "--help"} & set(paths):
        print("usage: python scripts/grammar_check.py [WORKLOAD.jsonl ...]\n\n" + (__doc__ or ""))
        return 0
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        print(f"error: not a workload file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:  # read before the engines: a workload that is not valid is named whether or not one is installed
        problems = [(f"{p}:{pid}", problem) for p in paths for _, pid, problem in iter_problems(Path(p))]
    except WorkloadError as exc:  # each line FILE:LINE: field: message
        print(f"error: {exc}", file=sys.stderr)
        return 2
    found = engines()
    if not found:
        print("no grammar engine installed (pip install xgrammar llguidance outlines-core)", file=sys.stderr)
        return 2
    seen: set[str] = set()
    failed = False
    for label, problem in problems + feature_problems():
        for turn in (0, 1):
            schema = turn_schema(problem, turn)
            key = json.dumps(schema, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            text = json.dumps(schema)
            for name, (compile_, accepts) in found.items():
                try:
                    compiled = compile_(text)
                except Exception as exc:  # noqa: BLE001 - each engine raises its own; a request gets 400
                    print(f"{label} turn {turn} | {name} | REFUSED: {str(exc).splitlines()[0][:200]}")
                    failed = True
                    continue
                wrong = []
                for what, action in cases(problem, turn):
                    valid = not schema_errors(action, schema)
                    if accepts(compiled, json.dumps(action, ensure_ascii=False)) != valid:
                        wrong.append(("accepts " if not valid else "refuses valid ") + what)
                failed |= bool(wrong)
                print(f"{label} turn {turn} | {name} | {'; '.join(wrong) or 'ok'}")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
