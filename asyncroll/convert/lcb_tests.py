"""LiveCodeBench test cases on the wire: decoding (safely), checking and encoding.

A row's ``public_test_cases`` is a JSON string of ``[{input, output, testtype}]``. Its
``private_test_cases`` is either the same kind of JSON string or, in the ``code_generation_lite``
release, base64 → zlib → pickle (of a ``str``) → that JSON. A pickle can name any importable callable,
so it is loaded with :class:`RefusingUnpickler`, whose ``find_class`` refuses every global: a pickled
string needs none, and anything else is an error, never an import. Decompression is capped so that a
small field cannot expand into an unbounded allocation.

Functional (LeetCode) tests hold one JSON value per input line (one per positional argument) and one JSON
value as output; both are checked here so that a malformed test is found at conversion, not mid-run.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from typing import Any

from asyncroll.evaluator.lcb_json import lcb_loads
from asyncroll.json_checks import LONE_SURROGATE, json_kind
from asyncroll.json_depth import json_loads

TEST_TYPES = ("stdin", "functional")
MAX_DECOMPRESSED = 1 << 30  # 1 GiB: the largest real private-test fields are far below this


class WireFormatError(ValueError):
    """A test-case field could not be decoded or a test is malformed; the message says which."""


class RefusingUnpickler(pickle.Unpickler):
    """An unpickler that loads only plain data: every global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise WireFormatError(
            f"the pickle refers to the global {module}.{name}; refused (only data is loaded)"
        )


def decode_private(field: str) -> list[dict[str, str]]:
    """Decode ``private_test_cases``: a JSON list, or base64 → zlib → pickle → JSON."""
    text = field.strip()
    if not text:
        return []
    if text.startswith("["):
        return check_tests(_json(text, "JSON"))
    try:
        # line breaks are allowed (`base64` and MIME wrap at 76 columns; LiveCodeBench's own decoder
        # skips them), any other character outside the alphabet is not
        compressed = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise WireFormatError(f"neither a JSON list nor base64: {exc}") from None
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(compressed, MAX_DECOMPRESSED)
        if inflater.unconsumed_tail:
            raise WireFormatError(f"decompresses to more than {MAX_DECOMPRESSED} bytes; refused")
        if not inflater.eof:
            raise WireFormatError("the zlib stream is truncated")
    except zlib.error as exc:
        raise WireFormatError(f"base64 data is not zlib-compressed: {exc}") from None
    try:
        loaded = RefusingUnpickler(io.BytesIO(raw)).load()
    except WireFormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a malformed field
        raise WireFormatError(f"not a valid pickle: {type(exc).__name__}: {exc}") from None
    if not isinstance(loaded, str):
        raise WireFormatError(f"the pickle holds a {type(loaded).__name__}, expected a JSON string")
    return check_tests(_json(loaded, "the unpickled JSON"))


def decode_public(field: str) -> list[dict[str, str]]:
    """Decode ``public_test_cases`` (a JSON string of a list; empty means none)."""
    return check_tests(_json(field, "JSON")) if field.strip() else []


def encode_private(tests: list[dict[str, str]]) -> str:
    """The inverse of :func:`decode_private` in the lite release's form (pickle protocol 4 of a JSON str).

    For building fixtures and examples in the real wire format.
    """
    blob = pickle.dumps(json.dumps(tests), protocol=4)
    return base64.b64encode(zlib.compress(blob)).decode("ascii")


def check_tests(value: Any) -> list[dict[str, str]]:
    """A list of ``{input, output, testtype}`` with string fields; functional tests parse as JSON."""
    if not isinstance(value, list):
        raise WireFormatError(f"expected a list of tests, got {json_kind(value)}")
    tests: list[dict[str, str]] = []
    for i, test in enumerate(value):
        if not isinstance(test, dict):
            raise WireFormatError(f"test [{i}]: expected an object, got {json_kind(test)}")
        for key in ("input", "output", "testtype"):
            if not isinstance(test.get(key), str):
                got = "missing" if key not in test else f"got {json_kind(test[key])}"
                raise WireFormatError(f"test [{i}].{key}: expected a string, {got}")
            try:  # a lone surrogate (escaped in the JSON, or in the pickled str) cannot be written as UTF-8
                test[key].encode("utf-8")
            except UnicodeEncodeError:
                raise WireFormatError(f"test [{i}].{key}: {LONE_SURROGATE}") from None
        if test["testtype"] not in TEST_TYPES:
            raise WireFormatError(f"test [{i}].testtype: {test['testtype']!r} is not one of {TEST_TYPES}")
        if test["testtype"] == "functional":
            _check_functional(i, test["input"], test["output"])
        tests.append({"input": test["input"], "output": test["output"], "testtype": test["testtype"]})
    return tests


def _check_functional(i: int, inputs: str, output: str) -> None:
    for n, line in enumerate(inputs.split("\n"), start=1):
        if line.strip():
            try:
                lcb_loads(line)
            except json.JSONDecodeError as exc:
                raise WireFormatError(f"test [{i}].input line {n}: not a JSON value: {exc.msg}") from None
            except (ValueError, RecursionError) as exc:  # an int past LiveCodeBench's digit limit, nesting
                raise WireFormatError(f"test [{i}].input line {n}: cannot be read: {exc}") from None
    try:
        lcb_loads(output)
    except json.JSONDecodeError as exc:
        raise WireFormatError(f"test [{i}].output: not a JSON value: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise WireFormatError(f"test [{i}].output: cannot be read: {exc}") from None


def _json(text: str, what: str) -> Any:
    try:
        return json_loads(text)
    except json.JSONDecodeError as exc:
        raise WireFormatError(
            f"{what} is not valid: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except (ValueError, RecursionError) as exc:  # an int past Python's digit limit, deep nesting
        raise WireFormatError(f"{what} cannot be read: {exc}") from None
