"""What JSON parsers let through that an input must not hold: a lone UTF-16 surrogate escape, which no
UTF-8 writer accepts, and a key given twice in one object, of which they keep the last silently; and the
strict scalar types a settings file's values are validated as (pydantic's lax mode converts silently).

``"\\ud800"`` is valid JSON text, and Python's and pydantic-core's parsers decode it into a string holding
a lone surrogate; every later UTF-8 write of that string (events.jsonl, a converted workload, a hash of
it) then fails. Inputs are checked once, where they are read, and refused with the field's place.

A file that is not UTF-8 JSON text at all yet (gzip-compressed, a zip archive, a Parquet shard, UTF-16 or
UTF-32 text) is named as such by its first bytes (:func:`container_kind`), for a converter's source and a
workload alike.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Collection
from typing import Annotated, Any

from pydantic import AfterValidator, Strict

#: The largest integer a setting may hold.
INT64_MAX = 2**63 - 1


def _int64(value: int) -> int:
    # a validator, not Field(le=...): a field's own Field(le=...) would replace that bound
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ValueError(f"must fit in 64 bits (at most {INT64_MAX})")
    return value


#: A settings file's values are JSON (or TOML): a number where a setting takes one, true/false where it is
#: a switch. Pydantic's lax mode read ``"cpu_workers": true`` as 1 worker, ``"max_turns": "8"`` as 8 and
#: ``"transcripts": "no"`` as off; these refuse each, naming the setting. (An int is a float.)
#: An integer setting is bounded to 64 bits: every setting is written into run.json and the events,
#: whose encoder refuses a larger one (``--max-active-trajectories 1e21`` as digits ran, then failed with
#: "TypeError: Integer exceeds 64-bit range", its output directory left half-written).
Int = Annotated[int, Strict(), AfterValidator(_int64)]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]

#: A JSON escape of a UTF-16 surrogate: either half of an escaped pair (an emoji) or a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")

LONE_SURROGATE = "not valid Unicode: a lone UTF-16 surrogate escape (\\ud800-\\udfff)"


def may_hold_surrogate(raw: bytes) -> bool:
    """Whether JSON text ``raw`` escapes a surrogate (cheap; most lines do not, and skip the walk)."""
    return _SURROGATE_ESCAPE.search(raw) is not None


#: What a file name's byte that is not UTF-8 becomes when Python decodes it (``surrogateescape``): a path
#: written by asyncroll itself (a run directory under ``LC_ALL=C``, or named in Latin-1) holds these.
_FILE_NAME_BYTE = re.compile("[\udc80-\udcff]")


def lone_surrogate_at(data: Any, file_names: Collection[str] = ()) -> str | None:
    """Where the first string (value or key) of parsed JSON holding a lone surrogate is, or None. The
    values of the keys ``file_names`` (paths, and messages that quote one) may hold a file name's
    undecodable bytes (U+DC80-U+DCFF), as Python spells them."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if file_names and where.rpartition(".")[2] in file_names:
                value = _FILE_NAME_BYTE.sub("", value)
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return where or "line"
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                stack.append((f"{where}.{key}" if where else str(key), item))
                stack.append((where or "line", key))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return None


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json``'s ``object_pairs_hook`` for an object whose keys are all different (``json`` and
    pydantic-core keep the last of a repeated key silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} is given twice in one object")
        out[key] = value
    return out


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words with its article (``null``, ``an array``, ``an object``):
    a message about a user's file names no Python type (``NoneType``, ``list``, ``dict``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"  # no JSON parser makes one; a caller's own value


#: Leading bytes of the files a download may be instead of JSON text, what each is, and how to get its
#: JSON Lines (``{out}``: the file to write them to).
_CONTAINERS = (
    (b"\x1f\x8b", "gzip-compressed", "decompress it first (`zcat FILE > {out}`)"),
    (
        b"PAR1",
        "a Parquet file",
        "export its rows as JSON Lines first (e.g. pandas `read_parquet(FILE)"
        ".to_json('{out}', orient='records', lines=True)`)",
    ),
    (b"PK\x03\x04", "a zip archive", "extract the JSON file from it first"),
    (b"(\xb5/\xfd", "zstd-compressed", "decompress it first (`zstd -d FILE -o {out}`)"),
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first (`xzcat FILE > {out}`)"),
    (b"BZh", "bzip2-compressed", "decompress it first (`bzcat FILE > {out}`)"),
)


def container_kind(head: bytes, out: str) -> str | None:
    """What a file that starts with ``head`` (its first 8 bytes) is when it is a compressed file, an
    archive or UTF-16/UTF-32 text rather than UTF-8 JSON text, with the way to its JSON Lines (``out``: the
    file name to suggest): "gzip-compressed, not JSON text: decompress it first (…)". None for anything
    else: it would otherwise be "not UTF-8 text", "not valid JSON" or NUL bytes on every line."""
    for magic, what, how in _CONTAINERS:
        if head.startswith(magic):
            return f"{what}, not JSON text: {how.format(out=out)}"
    wide = _wide_encoding(head)
    if wide is not None:
        return f"{wide} text, not UTF-8: convert it first (`iconv -f {wide} -t UTF-8 FILE > {out}`)"
    return None


def _wide_encoding(head: bytes) -> str | None:
    """UTF-16 or UTF-32 (with its byte order) judged by the first bytes: a JSON text starts with an ASCII
    character, which those encodings pad with NUL bytes (never in UTF-8 JSON text); a byte order mark
    before it is skipped. None where no NUL says so (a stray ``FF FE`` before UTF-8 text, say)."""
    if b"\0" not in head:
        return None
    for bom in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff", b"\xff\xfe", b"\xfe\xff"):
        if head.startswith(bom):
            head = head[len(bom) :]
            break
    if head[1:4] == b"\0\0\0" and head[:1] != b"\0":
        return "UTF-32LE"
    if head[:3] == b"\0\0\0" and head[3:4] != b"\0":
        return "UTF-32BE"
    if head[1:2] == b"\0" and head[:1] != b"\0":
        return "UTF-16LE"
    if head[:1] == b"\0" and head[1:2] != b"\0":
        return "UTF-16BE"
    return None


def json_error_text(exc: BaseException) -> str:
    """What a JSON parser's error says, without the advice Python adds for an integer past its digit
    limit (``; use sys.set_int_max_str_digits() to increase the limit``): a call for a programmer, which
    no flag or file of asyncroll lets a user make."""
    return str(exc).split("; use sys.set_int_max_str_digits()", 1)[0]


def line_column(exc: json.JSONDecodeError) -> int:
    """The 1-based column of ``exc`` in the one JSONL line it parsed. ``json`` counts the line's own
    newline: a line cut short (``{"id": "a"`` and its newline) failed at its "line 2 column 1", shown as
    "column 1", the line's first character, where the same text without the newline said its end."""
    end = len(exc.doc.rstrip("\r\n"))
    pos = min(exc.pos, end)
    return pos - exc.doc.rfind("\n", 0, pos)


def utf8_text(raw: bytes) -> str:
    """``raw`` as UTF-8 text, a leading byte order mark (Notepad's) dropped. Where it is not UTF-8, the
    error's places are ``raw``'s: ``utf-8-sig`` counts from after the mark, so :func:`not_utf8` said a
    byte 3 before the one a hex editor shows (a config's byte 14 was "byte 11")."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        mark = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
        if not mark:
            raise
        raise UnicodeDecodeError("utf-8", raw, exc.start + mark, exc.end + mark, exc.reason) from None


def not_utf8(exc: UnicodeDecodeError, *, of_line: bool = False) -> str:
    """A text that is not UTF-8, in one wording for every reader: ``not UTF-8 text (invalid start byte at
    byte 896, line 3)`` for a whole file (its line where past the first), ``… at byte 12 of the line)`` for
    one line of a JSONL file whose line the caller names (the codec's own message, "'utf-8' codec can't
    decode byte 0xe9 in position 896", named neither)."""
    if of_line:
        where = f"byte {exc.start} of the line"
    else:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        where = f"byte {exc.start}" + (f", line {line}" if line > 1 else "")
    return f"not UTF-8 text ({exc.reason} at {where})"
