"""Tool calls written by a model: extracted, parsed as data, validated against function docs.

Model text never reaches ``eval``/``exec``. A response is read in one of two formats:

* **JSON** (the tool-call format of the Qwen/Hermes chat templates): one or more blocks
  ``<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>``, parsed with :func:`json.loads`
  (text outside the blocks is ignored; ``NaN``/``Infinity`` and duplicate keys, at any level,
  are refused). A tag inside a JSON string (``{"content": "</tool_call>"}``) is data, not a tag:
  blocks are found by a scan that skips JSON strings; a tag left open or closed twice is refused.
* **Python call syntax** (BFCL's prompting format): ``[f(a=1, b="x"), g()]`` or one bare call
  ``f(a=1)``, optionally inside a Markdown code fence, parsed with ``ast.parse(mode="eval")``.
  Only these nodes are read: a list/tuple of calls (or one call) whose callee is a plain name,
  keyword arguments and positional arguments whose values are literals — ``Constant`` (str, int,
  float, bool, None), ``List``, ``Tuple``, ``Dict`` with string keys, and unary ``-``/``+`` on a
  number. Anything else (names, attributes, nested calls, lambdas, comprehensions, f-strings,
  operators, ``*args``/``**kwargs``, sets, bytes, complex numbers) is refused, and so are
  duplicate dictionary keys.

Both formats accept exactly the same names: function and parameter names must be written as the
docs list them, in ASCII. (Python's parser NFKC-normalises identifiers, so the fullwidth
``ｒｍ(...)`` would otherwise be read as ``rm``, a name JSON's ``"ｒｍ"`` does not match; the raw
tokens of call syntax are checked before the tree is read.)

A response whose whole body is call syntax is read as call syntax, even when a string literal in
it holds ``<tool_call>``; otherwise a response with ``<tool_call>`` tags is read as JSON.

Leading reasoning is removed first: ``<think>...</think>`` blocks at the start, or everything up to
the first ``</think>`` when the chat template opened the block (unfinished reasoning: no calls).
Only a leading block is reasoning, so think tags inside a later string argument are data (but a
response without reasoning that writes ``</think>`` in an argument is read as template-opened
reasoning up to it: the two cannot be told apart from the text). A response in neither format
(plain prose, or ``[]``) has **no calls**. A response that tries a format and fails is **rejected** with a
:class:`ToolCallError` whose message is meant for the model.

Limits (a rejection beyond them): :data:`MAX_TEXT_CHARS` characters of response,
:data:`MAX_CALLS` calls, containers nested :data:`MAX_DEPTH` deep with at most
:data:`MAX_ITEMS` entries, strings of at most :data:`MAX_STR_CHARS` characters, integers of
magnitude below 2**63, finite floats.

:func:`validate` then checks each call against the available function docs (BFCL's format:
``{"name", "description", "parameters": {"type": "dict", "properties", "required"}}``): the
function exists and is available, positional arguments are mapped to parameter names in the
docs' property order, required parameters are present, no unknown or duplicate parameters,
each value has its declared type (``string``, ``integer``, ``float``/``number``, ``boolean``,
``array``/``tuple`` with ``items``, ``dict``/``object`` with ``properties``, ``any``) and is in
``enum`` when one is given; ``None`` only for an optional parameter whose default is ``None``.
Only a validated :class:`ToolCall` becomes source text (:meth:`ToolCall.to_source`: ``repr``
of the validated literal values), and that text is parsed back and compared before it is
returned, so what an executor evaluates is exactly the validated data.
"""

from __future__ import annotations

import ast
import io
import json
import math
import re
import tokenize
import unicodedata
import warnings
from dataclasses import dataclass, field
from typing import Any

MAX_TEXT_CHARS = 32_000
MAX_CALLS = 64
MAX_DEPTH = 8
MAX_ITEMS = 1_000
MAX_STR_CHARS = 10_000
MAX_INT = 2**63 - 1

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
# inside a block: a JSON string (closed or, at the end of the text, not), a tag, or other text
_BLOCK_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*("?)|<tool_call>|</tool_call>|[^"<]+|<', re.DOTALL)
_UNBALANCED = "unbalanced <tool_call> tags: write each call as <tool_call>{...}</tool_call>"
_FENCE_LANGS = ("", "python", "py", "json", "tool_code", "tool_call")
# any identifier, not only ASCII ones: a call with a look-alike name is rejected with a message, not taken for prose
_CALL_START = re.compile(r"\A([^\W\d][\w.]*)\s*\(")


def _starts_like_a_call(body: str) -> bool:
    """Whether ``body`` opens as a call: an ASCII name and ``(``, or a look-alike name (one that
    NFKC-normalises to ASCII, as Python's parser would read it). Other prose that opens with a
    word and a bracket (``Voilà (done)``) is prose: no calls, as the same sentence in ASCII is."""
    match = _CALL_START.match(body)
    if match is None:
        return False
    name = match.group(1)
    return name.isascii() or unicodedata.normalize("NFKC", name).isascii()


class ToolCallError(ValueError):
    """A response that tried to call tools and failed; the message is shown to the model."""


@dataclass(frozen=True)
class RawCall:
    """A parsed call before validation: literal positional and keyword values."""

    name: str
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCall:
    """A validated call: a documented function and its keyword arguments (literal values only)."""

    name: str
    arguments: dict[str, Any]

    def to_source(self) -> str:
        """``name(k=repr(v), ...)``, checked by parsing it back (see the module docstring)."""
        if not _IDENT.match(self.name):
            raise ToolCallError(f"invalid function name {self.name!r}")
        for key in self.arguments:
            if not _IDENT.match(key):
                raise ToolCallError(f"invalid parameter name {key!r}")
        source = f"{self.name}(" + ", ".join(f"{k}={v!r}" for k, v in self.arguments.items()) + ")"
        back = parse_python(source)
        if len(back) != 1 or back[0].name != self.name or back[0].args or not _same(back[0].kwargs, self.arguments):
            raise ToolCallError(f"call of {self.name} does not round-trip")  # a bug, never expected
        return source


@dataclass(frozen=True)
class ParsedResponse:
    """What a response asks for: ``format`` is ``"json"``, ``"python"`` or ``None`` (no calls)."""

    format: str | None
    calls: list[RawCall]


def _same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (``1 == 1.0 == True`` is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return False
    return a == b


# --------------------------------------------------------------------------- extraction


def strip_reasoning(text: str) -> str:
    """``text`` without its leading reasoning (see the module docstring).

    Reasoning ends at the first ``</think>`` (the model cannot write that tag inside its reasoning
    without ending it); tags after it belong to the answer, e.g. to a string argument."""
    if not text.lstrip().startswith(_THINK_OPEN) and _THINK_CLOSE in text:  # the chat template opened the block
        text = text.split(_THINK_CLOSE, 1)[1]
    while text.lstrip().startswith(_THINK_OPEN):
        text = text.lstrip()
        close = text.find(_THINK_CLOSE)
        if close == -1:  # cut inside its reasoning: no answer yet
            return ""
        text = text[close + len(_THINK_CLOSE):]
    return text


def parse_response(text: str) -> ParsedResponse:
    """The calls a response makes (see the module docstring); raises :class:`ToolCallError`."""
    if not isinstance(text, str):
        raise ToolCallError("the response is not text")
    if len(text) > MAX_TEXT_CHARS:
        raise ToolCallError(f"the response has {len(text)} characters, more than {MAX_TEXT_CHARS}")
    text = strip_reasoning(text)
    body = text.strip()
    if body.startswith("```"):  # a Markdown code fence, closed or not
        lang = re.match(r"```([A-Za-z_]*)", body).group(1)
        body = body[3 + len(lang):] if lang.lower() in _FENCE_LANGS else body[3:]
        body = body.strip()
        if body.endswith("```"):
            body = body[:-3].strip()
    python_error = None
    if body.startswith("[") or _starts_like_a_call(body):
        # call syntax first: if the whole body parses, any tag in it sits inside a string literal
        try:
            calls = parse_python(body)
        except ToolCallError as err:
            python_error = err
        else:
            return ParsedResponse("python" if calls else None, calls)
    if _OPEN in text or _CLOSE in text:
        return ParsedResponse("json", parse_json_blocks(text))
    if python_error is not None:
        raise python_error
    return ParsedResponse(None, [])


def parse_json_blocks(text: str) -> list[RawCall]:
    """The calls of ``<tool_call>{...}</tool_call>`` blocks."""
    blocks = _json_blocks(text)
    if len(blocks) > MAX_CALLS:
        raise ToolCallError(f"{len(blocks)} calls in one response, more than {MAX_CALLS}")
    calls = []
    for i, block in enumerate(blocks):
        where = f"tool call {i + 1}"
        try:
            data = json.loads(block.strip(), parse_constant=_refuse_constant, parse_int=_json_int,
                              object_pairs_hook=_unique_keys)
        except ToolCallError as err:
            raise ToolCallError(f"{where}: {err}") from None
        except json.JSONDecodeError as err:
            raise ToolCallError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
        except (RecursionError, ValueError, MemoryError):
            raise ToolCallError(f"{where}: not valid JSON (too deeply nested or too large)") from None
        if not isinstance(data, dict):
            raise ToolCallError(f'{where}: expected an object {{"name": ..., "arguments": {{...}}}}')
        unknown = set(data) - {"name", "arguments"}
        if unknown:
            raise ToolCallError(f"{where}: unknown keys {sorted(unknown)}; expected 'name' and 'arguments'")
        name, arguments = data.get("name"), data.get("arguments", {})
        if not isinstance(name, str) or not _IDENT.match(name):
            raise ToolCallError(f"{where}: 'name' must be a function name, got {_short(name)}")
        if not isinstance(arguments, dict):
            raise ToolCallError(f"{where}: 'arguments' must be an object, got {_short(arguments)}")
        _check_json_value(arguments, 0, f"{where} ({name})")
        calls.append(RawCall(name, (), dict(arguments)))
    return calls


def _json_blocks(text: str) -> list[str]:
    """The bodies of the ``<tool_call>`` blocks, found by a scan that skips JSON strings (a tag
    inside a string is data); a tag left open, a stray closing tag or a nested opening tag is refused."""
    blocks: list[str] = []
    pos = 0
    while True:
        start, stray = text.find(_OPEN, pos), text.find(_CLOSE, pos)
        if stray != -1 and (start == -1 or stray < start):
            raise ToolCallError(_UNBALANCED)
        if start == -1:
            return blocks
        body_start = pos = start + len(_OPEN)
        while True:
            if pos >= len(text):
                raise ToolCallError(_UNBALANCED)
            token = _BLOCK_TOKEN.match(text, pos)
            if token.group() == _CLOSE:
                blocks.append(text[body_start:pos])
                pos = token.end()
                break
            if token.group() == _OPEN:
                raise ToolCallError(_UNBALANCED)
            if token.group().startswith('"') and not token.group(1):
                raise ToolCallError(f"tool call {len(blocks) + 1}: a string is not closed before the end of the text "
                                    "(or </tool_call> is missing)")
            pos = token.end()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused if a key repeats (``json.loads`` would keep the last value silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ToolCallError(f"key {_short(key)} given twice")
        out[key] = value
    return out


def _refuse_constant(name: str) -> Any:
    raise ToolCallError(f"{name} is not allowed (numbers must be finite)")


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ToolCallError(f"integer {text[:20]}... is too large")
    return int(text)


def _check_json_value(value: Any, depth: int, where: str) -> None:
    """The limits on a JSON value (JSON has no other node types to refuse)."""
    if depth > MAX_DEPTH:
        raise ToolCallError(f"{where}: values nested more than {MAX_DEPTH} deep")
    if isinstance(value, str):
        if len(value) > MAX_STR_CHARS:
            raise ToolCallError(f"{where}: a string of {len(value)} characters, more than {MAX_STR_CHARS}")
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int):
        if abs(value) > MAX_INT:
            raise ToolCallError(f"{where}: integer out of range")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ToolCallError(f"{where}: numbers must be finite")
    elif isinstance(value, (list, dict)):
        if len(value) > MAX_ITEMS:
            raise ToolCallError(f"{where}: a container of {len(value)} entries, more than {MAX_ITEMS}")
        for item in value.values() if isinstance(value, dict) else value:
            _check_json_value(item, depth + 1, where)
    else:  # pragma: no cover - json.loads makes nothing else
        raise ToolCallError(f"{where}: unsupported value")


def parse_python(text: str) -> list[RawCall]:
    """The calls of ``[f(a=1), g(2)]`` or ``f(a=1)``: literal arguments only, nothing evaluated."""
    if len(text) > MAX_TEXT_CHARS:
        raise ToolCallError(f"the calls have {len(text)} characters, more than {MAX_TEXT_CHARS}")
    try:
        with warnings.catch_warnings():  # model text may hold odd escapes: no warnings on our stderr
            warnings.simplefilter("ignore")
            tree = ast.parse(text, mode="eval")
    except SyntaxError as err:
        raise ToolCallError(f"not valid call syntax ({err.msg}); write [func(param=value, ...), ...]") from None
    except (ValueError, RecursionError, MemoryError, OverflowError):
        raise ToolCallError("not valid call syntax (too deeply nested or too large)") from None
    _check_ascii_names(text)
    body = tree.body
    nodes = body.elts if isinstance(body, (ast.List, ast.Tuple)) else [body]
    if len(nodes) > MAX_CALLS:
        raise ToolCallError(f"{len(nodes)} calls in one response, more than {MAX_CALLS}")
    return [_call(node, i) for i, node in enumerate(nodes)]


def _check_ascii_names(text: str) -> None:
    """Refuse names written with non-ASCII characters: the parser would NFKC-normalise them
    (``ｒｍ`` -> ``rm``), so the tree alone cannot tell a name from its look-alikes; the raw
    tokens can. String literals are single tokens, so their contents are not affected."""
    if text.isascii():
        return
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            # any token but a string or a comment: identifier characters the tokenizer does not
            # count as a name's (it matches names with \w) come out as error tokens
            if token.type not in (tokenize.STRING, tokenize.COMMENT) and not token.string.isascii():
                raise ToolCallError(f"{_short(token.string)} is not a name you can use: write function and parameter "
                                    "names exactly as the function docs list them")
    except (tokenize.TokenError, SyntaxError):  # pragma: no cover - ast.parse accepted the text
        raise ToolCallError("not valid call syntax") from None


def _call(node: ast.AST, index: int) -> RawCall:
    where = f"call {index + 1}"
    if not isinstance(node, ast.Call):
        raise ToolCallError(f"{where}: expected a function call func(param=value, ...), got {_node_name(node)}")
    if not isinstance(node.func, ast.Name):
        raise ToolCallError(f"{where}: the function must be a plain name, got {_node_name(node.func)}")
    name = node.func.id
    if name.startswith("__") or not _IDENT.match(name):
        raise ToolCallError(f"{where}: {name!r} is not a function you can call")
    where = f"{where} ({name})"
    args = []
    for arg in node.args:
        if isinstance(arg, ast.Starred):
            raise ToolCallError(f"{where}: *arguments are not allowed")
        args.append(_literal(arg, 0, where))
    kwargs: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ToolCallError(f"{where}: **arguments are not allowed")
        if kw.arg in kwargs:
            raise ToolCallError(f"{where}: parameter {kw.arg!r} given twice")
        kwargs[kw.arg] = _literal(kw.value, 0, f"{where}, parameter {kw.arg!r}")
    return RawCall(name, tuple(args), kwargs)


def _literal(node: ast.AST, depth: int, where: str) -> Any:
    if depth > MAX_DEPTH:
        raise ToolCallError(f"{where}: values nested more than {MAX_DEPTH} deep")
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, str):
            if len(value) > MAX_STR_CHARS:
                raise ToolCallError(f"{where}: a string of {len(value)} characters, more than {MAX_STR_CHARS}")
            return value
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if abs(value) > MAX_INT:
                raise ToolCallError(f"{where}: integer out of range")
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ToolCallError(f"{where}: numbers must be finite")
            return value
        raise ToolCallError(f"{where}: {type(value).__name__} literals are not allowed")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = node.operand
        if (isinstance(operand, ast.Constant) and isinstance(operand.value, (int, float))
                and not isinstance(operand.value, bool)):
            value = _literal(operand, depth + 1, where)
            return -value if isinstance(node.op, ast.USub) else value
        raise ToolCallError(f"{where}: a sign is only allowed before a number")
    if isinstance(node, (ast.List, ast.Tuple)):
        if len(node.elts) > MAX_ITEMS:
            raise ToolCallError(f"{where}: a container of {len(node.elts)} entries, more than {MAX_ITEMS}")
        items = []
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                raise ToolCallError(f"{where}: *unpacking is not allowed")
            items.append(_literal(elt, depth + 1, where))
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict):
        if len(node.keys) > MAX_ITEMS:
            raise ToolCallError(f"{where}: a container of {len(node.keys)} entries, more than {MAX_ITEMS}")
        out: dict[str, Any] = {}
        for key, value in zip(node.keys, node.values):
            if key is None:
                raise ToolCallError(f"{where}: **unpacking is not allowed")
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise ToolCallError(f"{where}: dictionary keys must be strings")
            if key.value in out:
                raise ToolCallError(f"{where}: key {_short(key.value)} given twice")
            out[key.value] = _literal(value, depth + 1, where)
        return out
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        raise ToolCallError(f"{where}: {node.id} is JSON; in call syntax write True, False or None")
    raise ToolCallError(f"{where}: only literal values are allowed, got {_node_name(node)}")


def _node_name(node: ast.AST) -> str:
    names = {
        ast.Name: "a name", ast.Attribute: "an attribute access", ast.Call: "a function call",
        ast.Lambda: "a lambda", ast.ListComp: "a comprehension", ast.SetComp: "a comprehension",
        ast.DictComp: "a comprehension", ast.GeneratorExp: "a generator", ast.JoinedStr: "an f-string",
        ast.BinOp: "an operator expression", ast.BoolOp: "an operator expression",
        ast.Compare: "a comparison", ast.Subscript: "a subscript", ast.Set: "a set",
        ast.IfExp: "a conditional expression", ast.NamedExpr: "an assignment expression",
        ast.Await: "an await", ast.Yield: "a yield", ast.YieldFrom: "a yield", ast.Starred: "an unpacking",
    }
    return names.get(type(node), f"a {type(node).__name__} expression")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --------------------------------------------------------------------------- validation

_JSON_TYPES = {"string": "a string", "integer": "an integer", "float": "a number", "number": "a number",
               "boolean": "a boolean", "array": "a list", "tuple": "a list", "list": "a list",
               "dict": "a dictionary", "object": "a dictionary", "any": "any value"}


def validate(raw: RawCall, docs: dict[str, dict]) -> ToolCall:
    """``raw`` checked against ``docs`` (function name -> BFCL function doc) of the callable functions."""
    doc = docs.get(raw.name)
    if doc is None:
        raise ToolCallError(f"unknown function {raw.name!r}; the available functions are listed in the instructions")
    params = doc.get("parameters", {}) or {}
    props: dict[str, dict] = params.get("properties", {}) or {}
    required = list(params.get("required", []) or [])
    names = list(props)
    if len(raw.args) > len(names):
        raise ToolCallError(f"{raw.name} takes at most {len(names)} arguments, got {len(raw.args)} positional ones")
    arguments: dict[str, Any] = {}
    for name, value in zip(names, raw.args):
        arguments[name] = value
    for name, value in raw.kwargs.items():
        if name not in props:
            raise ToolCallError(f"{raw.name} has no parameter {name!r}; its parameters are {names}")
        if name in arguments:
            raise ToolCallError(f"{raw.name}: parameter {name!r} given twice")
        arguments[name] = value
    missing = [name for name in required if name not in arguments]
    if missing:
        raise ToolCallError(f"{raw.name}: missing required parameter(s) {missing}")
    for name, value in arguments.items():
        schema = props[name]
        if value is None and name not in required and schema.get("default", "") in (None, "None"):
            continue
        _check_type(value, schema, f"{raw.name}: parameter {name!r}", 0)
    return ToolCall(raw.name, arguments)


def _check_type(value: Any, schema: dict, where: str, depth: int) -> None:
    kind = schema.get("type", "any") if isinstance(schema, dict) else "any"
    if depth > MAX_DEPTH:
        raise ToolCallError(f"{where}: nested too deep")
    ok = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, (list, tuple)),
        "tuple": lambda v: isinstance(v, (list, tuple)),
        "list": lambda v: isinstance(v, (list, tuple)),
        "dict": lambda v: isinstance(v, dict),
        "object": lambda v: isinstance(v, dict),
    }.get(kind)
    if ok is not None and not ok(value):
        raise ToolCallError(f"{where} must be {_JSON_TYPES[kind]}, got {_short(value)}")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolCallError(f"{where} must be one of {schema['enum'][:20]}, got {_short(value)}")
    if kind in ("array", "tuple", "list") and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _check_type(item, schema["items"], f"{where}[{i}]", depth + 1)
    if kind in ("dict", "object") and isinstance(schema.get("properties"), dict):
        sub = schema["properties"]
        for key, item in value.items():
            if key not in sub:
                raise ToolCallError(f"{where} has no field {key!r}; its fields are {list(sub)}")
            _check_type(item, sub[key], f"{where}[{key!r}]", depth + 1)
