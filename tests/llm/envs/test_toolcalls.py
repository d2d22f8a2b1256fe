"""The tool-call parser: both formats, validation against docs, hostile payloads, and a fuzz that nothing executes."""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import re
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seeupo.llm.envs.toolcalls import (
    MAX_DEPTH,
    MAX_STR_CHARS,
    ParsedResponse,
    RawCall,
    ToolCall,
    ToolCallError,
    parse_python,
    parse_response,
    validate,
)

DOCS = {
    "cd": {"name": "cd", "parameters": {"type": "dict", "properties": {"folder": {"type": "string"}}, "required": ["folder"]}},
    "ls": {"name": "ls", "parameters": {"type": "dict", "properties": {"a": {"type": "boolean", "default": False}}, "required": []}},
    "mean": {"name": "mean", "parameters": {"type": "dict", "properties": {
        "numbers": {"type": "array", "items": {"type": "float"}}}, "required": ["numbers"]}},
    "tail": {"name": "tail", "parameters": {"type": "dict", "properties": {
        "file_name": {"type": "string"}, "lines": {"type": "integer", "default": 10}}, "required": ["file_name"]}},
    "fetch": {"name": "fetch", "parameters": {"type": "dict", "properties": {
        "mode": {"type": "string", "enum": ["raw", "markdown"]}, "name": {"type": "string", "default": "None"}},
        "required": ["mode"]}},
    "edit": {"name": "edit", "parameters": {"type": "dict", "properties": {
        "updates": {"type": "dict", "properties": {"title": {"type": "string"}, "priority": {"type": "integer"}}}},
        "required": ["updates"]}},
    "anything": {"name": "anything", "parameters": {"type": "dict", "properties": {"x": {"type": "any"}}, "required": []}},
}


def calls_of(text: str) -> list[ToolCall]:
    return [validate(raw, DOCS) for raw in parse_response(text).calls]


@contextlib.contextmanager
def forbid_execution():
    """``eval``, ``exec``, ``os.system`` and ``os.popen`` raise inside the block: parsing and
    validation must not need them. (Not ``compile``: ``ast.parse`` is ``compile(..., PyCF_ONLY_AST)``.)"""

    def forbidden(*args, **kwargs):
        raise AssertionError("code execution attempted")

    saved = [(builtins, "eval"), (builtins, "exec"), (os, "system"), (os, "popen")]
    originals = [getattr(obj, name) for obj, name in saved]
    for obj, name in saved:
        setattr(obj, name, forbidden)
    try:
        yield
    finally:
        for (obj, name), original in zip(saved, originals):
            setattr(obj, name, original)


@pytest.fixture
def no_execution():
    with forbid_execution():
        yield


# --------------------------------------------------------------------------- the two formats


def test_python_syntax_several_calls_positional_and_keywords(no_execution):
    calls = calls_of("[cd(folder='documents'), tail('log.txt', lines=-3), ls(), mean(numbers=[1, 2.5, -0.5])]")
    assert [c.name for c in calls] == ["cd", "tail", "ls", "mean"]
    assert calls[1].arguments == {"file_name": "log.txt", "lines": -3}  # positional mapped by the docs' order
    assert calls[3].arguments == {"numbers": [1, 2.5, -0.5]}
    assert parse_response("[cd(folder='a')]").format == "python"


@pytest.mark.parametrize("text", [
    "cd(folder='x')",
    "```python\n[cd(folder='x')]\n```",
    "```\ncd(folder='x')\n```",
    "<think>I should change directory.</think>\n[cd(folder='x')]",
    "  [cd(folder='x')]  \n",
])
def test_python_syntax_variants(text, no_execution):
    assert calls_of(text) == [ToolCall("cd", {"folder": "x"})]


def test_json_tool_calls_of_the_qwen_template(no_execution):
    text = ('I will look.\n<tool_call>\n{"name": "cd", "arguments": {"folder": "docs"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "ls", "arguments": {"a": true}}\n</tool_call>')
    parsed = parse_response(text)
    assert parsed.format == "json"
    assert [validate(r, DOCS) for r in parsed.calls] == [ToolCall("cd", {"folder": "docs"}), ToolCall("ls", {"a": True})]
    assert calls_of('<tool_call>{"name": "ls"}</tool_call>') == [ToolCall("ls", {})]


@pytest.mark.parametrize("text", ["", "Done.", "I cannot do that: the file does not exist.", "[]", "```python\n[]\n```",
                                  "<think>[cd(folder='x')]</think>All done.",
                                  "Voilà (done)", "Готово (все файлы перемещены)"])  # prose whose first word is not a look-alike name
def test_responses_without_calls(text, no_execution):
    parsed = parse_response(text)
    assert parsed.format is None and parsed.calls == []


def test_source_is_built_from_validated_values_and_round_trips(no_execution):
    tricky = "it's \"quoted\" \\ back\nslash ls( cd( \x00 é"
    call = calls_of(f"[cd(folder={tricky!r})]")[0]
    source = call.to_source()
    assert source == f"cd(folder={tricky!r})"
    back = parse_python(source)
    assert back == [RawCall("cd", (), {"folder": tricky})]
    assert calls_of("[mean(numbers=(1, 2))]")[0].to_source() == "mean(numbers=(1, 2))"
    assert calls_of("[anything(x={'a': [None, True, -0.0, 1e-05]})]")[0].to_source() == \
        "anything(x={'a': [None, True, -0.0, 1e-05]})"


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("text, message", [
    ("[rm(folder='x')]", "unknown function 'rm'"),
    ("[cd()]", "missing required parameter(s) ['folder']"),
    ("[cd(folder='x', mode=1)]", "has no parameter 'mode'"),
    ("[cd('x', folder='y')]", "given twice"),
    ("[cd('x', 'y')]", "at most 1 arguments"),
    ("[cd(folder=1)]", "must be a string"),
    ("[tail(file_name='a', lines=True)]", "must be an integer"),
    ("[tail(file_name='a', lines=2.0)]", "must be an integer"),
    ("[ls(a=1)]", "must be a boolean"),
    ("[mean(numbers=[1, 'x'])]", "numbers'[1] must be a number"),
    ("[mean(numbers=3)]", "must be a list"),
    ("[fetch(mode='html')]", "must be one of"),
    ("[edit(updates={'title': 1})]", "must be a string"),
    ("[edit(updates={'owner': 'me'})]", "has no field 'owner'"),
    ("[cd(folder=None)]", "must be a string"),
])
def test_validation_errors(text, message, no_execution):
    with pytest.raises(ToolCallError, match=None) as err:
        calls_of(text)
    assert message in str(err.value)


def test_validation_accepts_ints_for_floats_and_none_for_none_defaults(no_execution):
    assert calls_of("[mean(numbers=[1, 2])]")[0].arguments == {"numbers": [1, 2]}
    assert calls_of("[fetch(mode='raw', name=None)]")[0].arguments == {"mode": "raw", "name": None}


# --------------------------------------------------------------------------- hostile payloads

HOSTILE = [
    "[__import__('os').system('touch /tmp/pwned')]",
    "__import__('os').system('touch /tmp/pwned')",
    "[cd(folder=__import__('os').system('touch /tmp/pwned'))]",
    "[os.system('ls')]",
    "[cd(folder=os.environ)]",
    "[cd(folder=x.y)]",
    "[cd(folder=ls())]",
    "[cd(folder=cd(folder='a'))]",
    "[cd(folder=(lambda: 'a')())]",
    "[cd(folder=lambda: 'a')]",
    "[cd(folder=[c for c in 'abc'])]",
    "[cd(folder={c: 1 for c in 'ab'})]",
    "[cd(folder=(c for c in 'ab'))]",
    "[cd(folder=f'{open(\"/etc/passwd\").read()}')]",
    "[cd(folder='a' + 'b')]",
    "[cd(folder='a' * 10**9)]",
    "[tail(file_name='a', lines=10**100)]",
    "[tail(file_name='a', lines=" + "9" * 5000 + ")]",
    "[cd(folder='" + "a" * (MAX_STR_CHARS + 1) + "')]",
    "[mean(numbers=" + "[" * 300 + "]" * 300 + ")]",
    "[mean(numbers=" + "[" * (MAX_DEPTH + 2) + "1" + "]" * (MAX_DEPTH + 2) + ")]",
    "[cd(folder={'a', 'b'})]",
    "[cd(folder=b'bytes')]",
    "[tail(file_name='a', lines=1j)]",
    "[cd(folder=...)]",
    "[cd(*['a'])]",
    "[cd(**{'folder': 'a'})]",
    "[mean(numbers=[*range(3)])]",
    "[cd(folder=not 1)]",
    "[cd(folder=-'a')]",
    "[cd(folder=(x := 'a'))]",
    "[cd(folder='a' if 1 else 'b')]",
    "[cd(folder=x[0])]",
    "[__class__(folder='a')]",
    "[__import__('os')]",
    "[cd.__globals__(folder='a')]",
    "[getattr(cd, '__globals__')]",
    "[eval('1')]",
    "[exec('import os')]",
    "[cd(folder=true)]",
    "[tail(file_name='a', lines=float('inf'))]",
    "[mean(numbers=[1e999])]",
    "[cd(folder='a'); import os]",
    "[cd(folder='a')]\nimport os",
    "[cd(folder='a'), 'just a string']",
    "[cd(folder='a')][0]",
    "[cd(folder='" + "\\N{LATIN SMALL LETTER A}" + "')] or os.system('x')",
    '<tool_call>{"name": "__import__", "arguments": {"name": "os"}}</tool_call>',
    '<tool_call>{"name": "cd.__globals__", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"folder": "a"}, "code": "import os"}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": "folder=__import__(\'os\')"}</tool_call>',
    '<tool_call>{"name": "tail", "arguments": {"file_name": "a", "lines": NaN}}</tool_call>',
    '<tool_call>{"name": "tail", "arguments": {"file_name": "a", "lines": ' + "9" * 400 + '}}</tool_call>',
    '<tool_call>{"name": "mean", "arguments": {"numbers": ' + "[" * 5000 + "]" * 5000 + '}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"folder": "a"}}',
    '<tool_call>["cd", {"folder": "a"}]</tool_call>',
    '<tool_call>{"name": "rm", "arguments": {"path": "/"}}</tool_call>',
    "x" * 40_000,
    # duplicate keys: json.loads alone keeps the last value, so the first two would run `ls`
    '<tool_call>{"name": "rm", "name": "ls"}</tool_call>',
    '<tool_call>{"name": "ls", "name": "rm"}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"folder": "a", "folder": "b"}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"folder": "a"}, "arguments": {"folder": "b"}}</tool_call>',
    '<tool_call>{"name": "edit", "arguments": {"updates": {"title": "a", "title": "b"}}}</tool_call>',
    "[edit(updates={'title': 'a', 'title': 'b'})]",
    # NFKC look-alikes of documented names: Python's parser would read them as `cd` / `folder`
    "[ｃｄ(folder='a')]",
    "ｃｄ(folder='a')",
    "[𝐜𝐝(folder='a')]",
    "[ℓs()]",
    "[cd(ｆｏｌｄｅｒ='a')]",
    "[tail(file_name='a', ｌines=3)]",
    '<tool_call>{"name": "ｃｄ", "arguments": {"folder": "a"}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"ｆｏｌｄｅｒ": "a"}}</tool_call>',
    # tags that really are unbalanced (a tag inside a string is data, see below)
    '{"name": "cd", "arguments": {"folder": "a"}}</tool_call>',
    '<tool_call><tool_call>{"name": "cd", "arguments": {"folder": "a"}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"folder": "a"}}</tool_call></tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"folder": "a}}</tool_call>',
    "[cd(folder='a')] <tool_call>",
    "[cd(folder='a')]</tool_call>",
    "[cd(folder='<tool_call>')] </tool_call>",
]


@pytest.mark.parametrize("payload", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_payloads_are_rejected_with_a_message(payload, no_execution):
    with pytest.raises(ToolCallError) as err:
        calls = calls_of(payload)
        if not calls:  # "x" * 40_000 is not a call at all; make it one
            raise AssertionError("not rejected")
    assert str(err.value)
    assert not os.path.exists("/tmp/pwned")


def rejection(text: str) -> str:
    with pytest.raises(ToolCallError) as err, forbid_execution():
        calls_of(text)
    return str(err.value)


def test_duplicate_keys_are_refused_in_both_formats_at_any_level():
    assert "key 'name' given twice" in rejection('<tool_call>{"name": "rm", "name": "ls"}</tool_call>')
    assert "tool call 2: key 'folder' given twice" in rejection(
        '<tool_call>{"name": "ls"}</tool_call><tool_call>{"name": "cd", "arguments": {"folder": "a", "folder": "a"}}'
        "</tool_call>")
    assert "key 'title' given twice" in rejection(
        '<tool_call>{"name": "anything", "arguments": {"x": [{"title": 1, "title": 1}]}}</tool_call>')
    assert "key 'title' given twice" in rejection("[anything(x=[{'title': 1, 'title': 1}])]")
    assert "parameter 'folder' given twice" in rejection("[cd(folder='a', folder='a')]")
    # keys equal only after NFKC, or only in case, are distinct keys (of which one is unknown)
    expected = [ToolCall("anything", {"x": {"a": 1, "A": 2, "ａ": 3}})]
    assert calls_of('<tool_call>{"name": "anything", "arguments": {"x": {"a": 1, "A": 2, "ａ": 3}}}</tool_call>') == \
        calls_of("[anything(x={'a': 1, 'A': 2, 'ａ': 3})]") == expected


# strings without a reasoning tag: a response holding "</think>" anywhere ends its reasoning there by design
# (strip_reasoning: the chat template may have opened the block), so such a string cannot be a call's argument
finite_literals = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**62), 2**62), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=10).filter(lambda s: "think>" not in s)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=3), finite_literals, min_size=1, max_size=4), finite_literals, st.data())
def test_fuzz_a_repeated_key_anywhere_is_refused_in_both_formats(obj, other, data):
    """An object with one key written twice (a different value or the same), alone or inside a list
    or another object, is refused in JSON and in call syntax; written once, it is accepted as is."""
    key = data.draw(st.sampled_from(sorted(obj)))
    value = data.draw(st.sampled_from([obj[key], other]))
    wrap = data.draw(st.sampled_from(["{}", "[{}]", '{{"k": {}}}']))
    once_json = json.dumps(obj)
    twice_json = once_json[:-1] + ", " + json.dumps(key) + ": " + json.dumps(value) + "}"
    once_py, twice_py = repr(obj), repr(obj)[:-1] + ", " + repr(key) + ": " + repr(value) + "}"
    wrap_py = wrap.replace('"k"', "'k'")
    for text in (f'<tool_call>{{"name": "anything", "arguments": {{"x": {wrap.format(twice_json)}}}}}</tool_call>',
                 f"[anything(x={wrap_py.format(twice_py)})]"):
        assert "given twice" in rejection(text), text
    accepted = outcome(f'<tool_call>{{"name": "anything", "arguments": {{"x": {wrap.format(once_json)}}}}}</tool_call>')
    assert accepted == outcome(f"[anything(x={wrap_py.format(once_py)})]") != "rejected"
    assert json.dumps(accepted[0].arguments["x"]) == wrap.format(once_json)


def look_alikes(name: str) -> list[str]:
    """Spellings of an ASCII name that NFKC maps back to it: fullwidth, mathematical bold, mixed."""
    fullwidth = "".join(chr(ord(c) + 0xFEE0) for c in name)
    bold = "".join(chr(0x1D41A + ord(c) - ord("a")) if c.islower() else c for c in name)
    mixed = fullwidth[0] + name[1:]
    out = [fullwidth, bold, mixed]
    for variant in out:
        assert variant != name and unicodedata.normalize("NFKC", variant) == name
    return out


def outcome(text: str) -> list[ToolCall] | str:
    try:
        with forbid_execution():
            return calls_of(text)
    except ToolCallError:
        return "rejected"


@pytest.mark.parametrize("name", sorted(DOCS))
def test_function_names_match_exactly_in_both_formats(name):
    """A name NFKC maps to a documented one is refused in call syntax as it is in JSON."""
    args = {"cd": {"folder": "a"}, "mean": {"numbers": [1]}, "tail": {"file_name": "a"}, "fetch": {"mode": "raw"},
            "edit": {"updates": {}}}.get(name, {})
    keywords = ", ".join(f"{k}={v!r}" for k, v in args.items())
    assert outcome(f"[{name}({keywords})]") == outcome(f"<tool_call>{json.dumps({'name': name, 'arguments': args})}"
                                                       "</tool_call>") == [ToolCall(name, args)]
    for variant in look_alikes(name):
        assert outcome(f"[{variant}({keywords})]") == "rejected"
        assert outcome(f"{variant}({keywords})") == "rejected"
        assert outcome(json.dumps({"name": variant, "arguments": args}).join(["<tool_call>", "</tool_call>"])) == \
            "rejected"
    assert "not a name you can use" in rejection(f"[{look_alikes(name)[0]}({keywords})]")


@pytest.mark.parametrize("name, param, value", [("cd", "folder", "a"), ("tail", "file_name", "a"), ("tail", "lines", 3),
                                                ("mean", "numbers", [1])])
def test_parameter_names_match_exactly_in_both_formats(name, param, value):
    required = {"tail": {"file_name": "a"}}.get(name, {})
    for variant in look_alikes(param):
        args = {**required, variant: value}
        keywords = ", ".join(f"{k}={v!r}" for k, v in args.items())
        assert outcome(f"[{name}({keywords})]") == "rejected"
        assert outcome(f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>") == "rejected"


def test_every_character_nfkc_maps_into_a_name_is_refused_in_both_formats():
    """All of Unicode: each character that NFKC turns into ASCII name characters, written at the
    start, middle or end of a function or parameter name, gives the same outcome in both formats
    (a rejection: the name is not the documented one)."""
    look_alike = [chr(cp) for cp in range(0x80, 0x110000) if not 0xD800 <= cp <= 0xDFFF
                  and unicodedata.normalize("NFKC", chr(cp)) != chr(cp)
                  and re.fullmatch(r"[A-Za-z0-9_]*", unicodedata.normalize("NFKC", chr(cp)))]
    assert len(look_alike) > 1000  # fullwidth and mathematical letters and digits, ligatures, super/subscripts, ...
    for c in look_alike:
        for name, param in [(c + "cd", "folder"), ("c" + c + "d", "folder"), ("cd" + c, "folder"),
                            ("cd", c + "folder"), ("cd", "fold" + c + "er"), ("cd", "folder" + c)]:
            python = outcome(f"[{name}({param}='a')]")
            assert python == "rejected", (hex(ord(c)), name, param)
            assert outcome(f"<tool_call>{json.dumps({'name': name, 'arguments': {param: 'a'}})}</tool_call>") == python


LOOK_ALIKE_CHARS = {c: [c, chr(ord(c) + 0xFEE0)] + ([chr(0x1D41A + ord(c) - ord("a"))] if c.islower() else [])
                    for c in "abcdefghijklmnopqrstuvwxyz_0123456789"}


@st.composite
def spelled(draw, names):
    """A documented name with some characters swapped for look-alikes, or an arbitrary identifier-ish text."""
    if draw(st.booleans()):
        return "".join(draw(st.sampled_from(LOOK_ALIKE_CHARS[c])) for c in draw(st.sampled_from(names)))
    return draw(st.text(st.sampled_from(sorted({v for vs in LOOK_ALIKE_CHARS.values() for v in vs})), max_size=10))


@settings(max_examples=300, deadline=None)
@given(spelled(sorted(DOCS)), spelled(["folder", "file_name", "lines", "numbers", "a", "x"]))
def test_fuzz_both_formats_accept_exactly_the_same_names(name, param):
    value = [1] if param.endswith("numbers") else "a"
    python = outcome(f"[{name}({param}={value!r})]")
    json_format = outcome(f"<tool_call>{json.dumps({'name': name, 'arguments': {param: value}})}</tool_call>")
    assert python == json_format
    if python != "rejected":
        assert name.isascii() and param.isascii()


TAGGED = ["<tool_call>", "</tool_call>", "a</tool_call>b<tool_call>c", '</tool_call><tool_call>{"name": "rm"}',
          "<tool_call></tool_call>", 'say "</tool_call>" \\', "it's \"</tool_call>\" '<tool_call>'"]


@pytest.mark.parametrize("folder", TAGGED)
def test_a_tag_inside_a_string_argument_is_data(folder):
    expected = [ToolCall("cd", {"folder": folder})]
    assert outcome(f"[cd(folder={folder!r})]") == expected
    assert outcome(f"cd(folder={folder!r})") == expected
    assert outcome(f"```python\n[cd(folder={folder!r})]\n```") == expected
    block = "<tool_call>" + json.dumps({"name": "cd", "arguments": {"folder": folder}}) + "</tool_call>"
    assert outcome(block) == expected
    assert outcome(f"Sure.\n{block}\n{block}") == expected * 2


@pytest.mark.parametrize("reasoning", ["<think>I will write it.</think>\n", "<think>a</think> <think>b</think>\n",
                                       "The template opened the block; I will write it.</think>\n\n"])
@pytest.mark.parametrize("folder", ["</think>", "<think>x</think>y", "a</think>b</think>c", "<think>"])
def test_only_leading_reasoning_is_removed_think_tags_in_arguments_are_data(reasoning, folder):
    expected = [ToolCall("cd", {"folder": folder})]
    assert outcome(f"{reasoning}[cd(folder={folder!r})]") == expected
    block = "<tool_call>" + json.dumps({"name": "cd", "arguments": {"folder": folder}}) + "</tool_call>"
    assert outcome(f"{reasoning}{block}") == expected


@pytest.mark.parametrize("text", ["<think>I will call [cd(folder='x')]",
                                  "<think>cut here <tool_call>{\"name\": \"ls\"}</tool_call>",
                                  "<think>done</think><think>cut again [cd(folder='x')]"])
def test_unfinished_reasoning_makes_no_calls(text):
    assert parse_response(text) == ParsedResponse(None, [])


tag_strings = st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "</think>", '"', "'", "\\", "ls(",
                                        "cd(x)", "{", "}", "[", "]", "a", " ", "\n", "<", ">", "tool_call"]),
                       max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(tag_strings, st.data())
def test_fuzz_string_arguments_reach_the_call_exactly_in_both_formats(folder, data):
    """Any string of tags, quotes and call-like text arrives as written, after any kind of reasoning
    (without reasoning too, unless it holds ``</think>``: that is where template-opened reasoning ends)."""
    prefixes = ["<think>r</think>\n", "r</think>\n"] + ([] if "</think>" in folder else [""])
    prefix = data.draw(st.sampled_from(prefixes))
    expected = [ToolCall("cd", {"folder": folder})]
    assert outcome(f"{prefix}[cd(folder={folder!r})]") == expected
    block = "<tool_call>" + json.dumps({"name": "cd", "arguments": {"folder": folder}}) + "</tool_call>"
    assert outcome(prefix + block) == expected
    assert expected[0].to_source() == f"cd(folder={folder!r})"


# --------------------------------------------------------------------------- fuzz

NON_LITERALS = ["__import__('os')", "os.system('x')", "x", "x.y", "f()", "lambda: 1", "[i for i in x]",
                "f'{x}'", "1 + 2", "{1, 2}", "b'x'", "1j", "...", "not x", "x[0]", "(y := 1)", "*a", "**k",
                "__builtins__", "().__class__", "'a' * 99"]

literals = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
              st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=12,
)


@st.composite
def python_payloads(draw):
    """Call syntax assembled from literal and non-literal pieces; returns (text, uses_a_non_literal)."""
    hostile = False
    calls = []
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(sorted(DOCS) + ["rm", "__import__", "eval", "os.system", "cd.__globals__"]))
        hostile |= name in ("__import__", "eval", "os.system", "cd.__globals__")
        args = []
        for _ in range(draw(st.integers(0, 3))):
            if draw(st.booleans()):
                piece = draw(st.sampled_from(NON_LITERALS))
                hostile = True
            else:
                value = draw(literals)
                piece = repr(value)
            key = draw(st.sampled_from(["", "folder=", "lines=", "numbers=", "x=", "__class__="]))
            args.append(key + piece)
        calls.append(f"{name}({', '.join(args)})")
    text = "[" + ", ".join(calls) + "]"
    if draw(st.booleans()):
        text = draw(st.sampled_from(["", "```python\n", "<think>hm</think>"])) + text
    return text, hostile


@st.composite
def json_payloads(draw):
    body = draw(st.one_of(
        st.fixed_dictionaries({"name": st.sampled_from(sorted(DOCS) + ["rm", "__import__"]),
                               "arguments": st.dictionaries(st.sampled_from(["folder", "lines", "numbers", "x", "a"]),
                                                            literals, max_size=3)}),
        literals,
    ))
    try:
        text = json.dumps(body)
    except (ValueError, OverflowError):
        text = str(body)
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    return "<tool_call>" + text + "</tool_call>" * draw(st.integers(0, 2))


def _parse_or_error(text: str):
    try:
        with forbid_execution():
            calls = calls_of(text)
    except ToolCallError as err:
        assert str(err)
        return None
    for call in calls:  # accepted: the source evaluates only literals, and round-trips
        with forbid_execution():
            source = call.to_source()
        assert parse_python(source)[0].name == call.name
    return calls


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text(max_size=300))
def test_fuzz_arbitrary_text_never_crashes_or_executes(text):
    _parse_or_error(text)


@FUZZ
@given(python_payloads())
def test_fuzz_call_syntax_rejects_every_non_literal(payload):
    text, hostile = payload
    calls = _parse_or_error(text)
    if hostile:
        assert calls is None, text


@FUZZ
@given(json_payloads())
def test_fuzz_json_near_misses(text):
    _parse_or_error(text)


@FUZZ
@given(st.lists(st.sampled_from(["[", "]", "(", ")", "cd", "folder", "=", "'a'", ",", "1", "-", "{", "}", ":",
                                 "lambda", ".", "__import__", "*", "**", "<tool_call>", "</tool_call>", '"', "\\",
                                 "f'", "{x}", "\n", "#", ";"]), max_size=30).map("".join))
def test_fuzz_token_soup(text):
    _parse_or_error(text)


@pytest.mark.parametrize("text", ["```tail(file_name='a')```", "```python\n[tail(file_name='a')]", "```py [tail('a')]```"])
def test_fences_closed_or_not(text, no_execution):
    assert calls_of(text) == [ToolCall("tail", {"file_name": "a"})]


def test_odd_escapes_in_model_text_raise_no_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = parse_response(r"[cd(folder='a\[b')]")
    assert result.calls
