"""The validation layer: JSON limits, typed fields, flag types (the CLI tests cover their messages)."""

import argparse
import math
from dataclasses import dataclass
from typing import Literal

import pytest

from seeupo.validation.arguments import comma_list, positive_int, probability
from seeupo.validation.errors import InputError
from seeupo.validation.files import MAX_DEPTH, json_depth, parse_json
from seeupo.validation.schemas import dataclass_from_dict, table_cells


def test_json_depth_ignores_brackets_in_strings():
    assert json_depth(b'{"a": [[1, 2], [3]], "b": "[[[[[[[[ \\" [[["}') == 3
    assert json_depth(b"1") == 0
    assert json_depth(b"[" * 500 + b"]" * 500) == 500


def test_parse_json_limits_name_the_source():
    with pytest.raises(InputError, match=r"^f\.json: JSON nested 65 deep"):
        parse_json(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "f.json")
    with pytest.raises(InputError, match=r"^f\.json: an integer of 31 digits"):
        parse_json(b"[1" + b"0" * 30 + b"]", "f.json")
    with pytest.raises(InputError, match=r"^f\.json: not UTF-8"):
        parse_json('{"a": 1}'.encode("utf-16"), "f.json")
    assert parse_json("\ufeff[1.5]".encode(), "f.json") == [1.5]  # a UTF-8 byte-order mark is fine
    assert math.isnan(parse_json(b"[NaN]", "f.json")[0])  # non-finite numbers are refused by the field readers


@dataclass(frozen=True)
class Settings:
    mode: Literal["a", "b"] = "a"
    count: int = 1
    scale: float = 1.0
    flag: bool = False
    pair: tuple[float, float] = (0.0, 1.0)
    order: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.pair[0] > self.pair[1]:
            raise ValueError("pair must be ordered")


@pytest.mark.parametrize(
    "data, field",
    [
        ({"mode": "c"}, "s.mode"),
        ({"count": True}, "s.count"),
        ({"count": "1"}, "s.count"),
        ({"count": 1.0}, "s.count"),
        ({"count": 11}, "s.count"),
        ({"scale": "1"}, "s.scale"),
        ({"scale": float("nan")}, "s.scale"),
        ({"flag": 1}, "s.flag"),
        ({"pair": [0.0]}, "s.pair"),
        ({"pair": [0.0, "1"]}, "s.pair[1]"),
        ({"order": [0, False]}, "s.order[1]"),
        ({"extra": 1}, "s.extra"),
        ({"pair": [2.0, 1.0]}, "s"),  # the class's own check
        ([1], "s"),
    ],
)
def test_dataclass_from_dict_checks_types_and_names_the_field(data, field):
    with pytest.raises(InputError) as err:
        dataclass_from_dict(Settings, data, "s", {"count": (1, 10)})
    assert err.value.field == field


def test_dataclass_from_dict_builds_with_defaults():
    got = dataclass_from_dict(Settings, {"mode": "b", "pair": [0.5, 2], "order": [1, 0], "scale": 3}, "s")
    assert got == Settings(mode="b", pair=(0.5, 2.0), order=(1, 0), scale=3.0)


def test_flag_types():
    assert positive_int("7") == 7 and probability("0.25") == 0.25
    assert comma_list(("x", "y"))("y, x") == ("y", "x")
    for parse, text in [(positive_int, "0"), (positive_int, "1.0"), (positive_int, "9" * 40), (probability, "nan"),
                        (probability, "1.5"), (comma_list(("x",)), ""), (comma_list(("x",)), "x,z")]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_table_cells():
    assert table_cells(2, (3, 4)) == 2 * 3 + 2 * 3 * 4
    assert table_cells(1, (2, 2), (3, 1)) == 6 + 6 * 2


def test_a_field_of_several_types_takes_any_and_names_them_all_when_none_fits():
    from seeupo.validation.errors import InputError
    from seeupo.validation.schemas import dataclass_from_dict

    @dataclass(frozen=True)
    class Switch:
        on: bool | Literal["auto"] = "auto"

    assert dataclass_from_dict(Switch, {"on": True}, "cfg").on is True
    assert dataclass_from_dict(Switch, {"on": "auto"}, "cfg").on == "auto"
    with pytest.raises(InputError, match=r"field 'cfg.on': must be true or false or 'auto', got 'maybe'$"):
        dataclass_from_dict(Switch, {"on": "maybe"}, "cfg")


def test_move_earlier_outputs_aside_refuses_then_moves_and_deletes_nothing(tmp_path):
    from seeupo.validation.arguments import move_earlier_outputs_aside
    from seeupo.validation.errors import InputError

    said: list[str] = []
    assert move_earlier_outputs_aside(tmp_path, ("a.json", "b"), False, "run", said.append) == []  # nothing earlier
    (tmp_path / "a.json").write_text("1")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("2")
    (tmp_path / "other.txt").write_text("3")
    with pytest.raises(InputError, match="holds an earlier run's a.json; .*--overwrite"):
        move_earlier_outputs_aside(tmp_path, ("a.json", "b"), False, "run", said.append)
    assert (tmp_path / "a.json").read_text() == "1" and not said
    first = move_earlier_outputs_aside(tmp_path, ("a.json", "b"), True, "run", said.append)
    (tmp_path / "a.json").write_text("4")
    second = move_earlier_outputs_aside(tmp_path, ("a.json", "b"), True, "run", said.append)
    assert [m.split("/")[1] for m in first] == ["a.json", "b"] and [m.split("/")[1] for m in second] == ["a.json"]
    assert first[0].split("/")[0] != second[0].split("/")[0]  # two runs in one second: two folders
    assert (tmp_path / first[0]).read_text() == "1" and (tmp_path / first[1] / "x").read_text() == "2"
    assert (tmp_path / second[0]).read_text() == "4" and (tmp_path / "other.txt").read_text() == "3"
    assert len(said) == 2 and all("nothing deleted" in line for line in said)
