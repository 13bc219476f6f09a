"""The Dataset protocol and InMemDataset: lists, CSV files and JSON-lines files."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from ember.backend.errors import ArgumentError, EmberError, EmberIndexError
from ember.data.dataset.base import Dataset, DatasetError, DatasetFileNotFoundError
from ember.data.dataset.in_memory import InMemDataset


@dataclasses.dataclass
class Row:
    name: str
    count: int
    score: float
    flag: bool
    note: str | None = None


class Cubes(Dataset[int]):
    """A dataset written against the protocol alone: only get and __len__."""

    def __init__(self, n: int):
        self.n = n
        self.calls: list[int] = []

    def get(self, index: int) -> int | None:
        self.calls.append(index)
        return index**3 if 0 <= index < self.n else None

    def __len__(self) -> int:
        return self.n


# ------------------------------------------------------------------ protocol
def test_protocol_gives_indexing_and_iteration():
    cubes = Cubes(4)
    assert len(cubes) == 4
    assert [cubes[i] for i in range(4)] == [0, 1, 8, 27]
    assert cubes[-1] == 27 and cubes[-4] == 0
    assert cubes[np.int64(2)] == 8
    assert list(cubes) == [0, 1, 8, 27]
    assert cubes.get(4) is None and cubes.get(-1) is None
    assert not cubes.is_empty() and Cubes(0).is_empty()
    assert repr(cubes) == "Cubes(len=4)"


@pytest.mark.parametrize("index", [4, 5, -5, 100])
def test_out_of_range_raises_ember_index_error(index):
    cubes = Cubes(4)
    with pytest.raises(EmberIndexError, match=rf"Cubes index {index} is out of range for a "
                                              r"dataset of 4 items"):
        cubes[index]
    # The protocol checks the range before asking the dataset.
    assert index not in cubes.calls
    with pytest.raises(IndexError):  # EmberIndexError is also the built-in IndexError
        cubes[index]


def test_non_integer_index_raises_argument_error():
    with pytest.raises(ArgumentError, match="Cubes indices must be integers, got str"):
        Cubes(3)["1"]
    with pytest.raises(ArgumentError, match="got float"):
        Cubes(3)[1.0]


def test_protocol_is_abstract():
    with pytest.raises(TypeError):
        Dataset()  # type: ignore[abstract]


# ------------------------------------------------------------------ lists
def test_in_memory_from_list():
    source = ["a", "b", "c"]
    dataset = InMemDataset(source)
    source.append("d")  # the dataset copied the list
    assert len(dataset) == 3
    assert dataset[0] == "a" and dataset[2] == "c" and dataset[-1] == "c"
    assert dataset.get(3) is None and dataset.get(-1) is None
    assert list(dataset) == ["a", "b", "c"]
    with pytest.raises(EmberIndexError, match="InMemDataset index 3 is out of range"):
        dataset[3]


def test_in_memory_empty_and_from_generator():
    assert len(InMemDataset([])) == 0 and list(InMemDataset([])) == []
    assert list(InMemDataset(i * 2 for i in range(3))) == [0, 2, 4]
    with pytest.raises(EmberIndexError):
        InMemDataset([])[0]


def test_in_memory_from_dataset():
    assert list(InMemDataset.from_dataset(Cubes(3))) == [0, 1, 8]


# ------------------------------------------------------------------ CSV
def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_rows_as_dicts(tmp_path):
    path = write(tmp_path, "a.csv", 'name,text\nada,"hello, world"\nbob,"two\nlines"\n\n')
    dataset = InMemDataset.from_csv(path)
    assert len(dataset) == 2
    assert dataset[0] == {"name": "ada", "text": "hello, world"}
    assert dataset[1] == {"name": "bob", "text": "two\nlines"}


def test_csv_typed_rows_with_a_dataclass(tmp_path):
    path = write(tmp_path, "rows.csv",
                 "name,count,score,flag,note\nada,3,0.5,true,\nbob,-2,1e3,0,hi\n")
    dataset = InMemDataset.from_csv(path, Row)
    assert list(dataset) == [Row("ada", 3, 0.5, True, None), Row("bob", -2, 1000.0, False, "hi")]
    # A field with a default may be absent from the header.
    path = write(tmp_path, "short.csv", "name,count,score,flag\ncy,1,2,yes\n")
    assert InMemDataset.from_csv(path, Row)[0] == Row("cy", 1, 2.0, True)


def test_csv_with_a_converter_and_options(tmp_path):
    path = write(tmp_path, "semi.csv", "1;2\n3;4\n")
    dataset = InMemDataset.from_csv(path, lambda row: int(row["a"]) + int(row["b"]),
                                    delimiter=";", has_header=False, columns=["a", "b"])
    assert list(dataset) == [3, 7]


def test_csv_missing_cell_names_path_and_line(tmp_path):
    path = write(tmp_path, "bad.csv", "name,count,score\nada,1,2.0\nbob,2\n")
    with pytest.raises(DatasetError) as info:
        InMemDataset.from_csv(path)
    message = str(info.value)
    assert message == (f"{path}, line 3: the row has 2 cells, the header names 3 columns "
                       f"(name, count, score); missing score")
    assert info.value.file == str(path) and info.value.line == 3
    assert isinstance(info.value, EmberError) and isinstance(info.value, ValueError)


def test_csv_extra_cell(tmp_path):
    path = write(tmp_path, "bad.csv", "a,b\n1,2\n\n1,2,3\n")
    with pytest.raises(DatasetError, match=r"bad\.csv, line 4: the row has 3 cells, the header "
                                           r"names 2 columns \(a, b\)$"):
        InMemDataset.from_csv(path)


def test_csv_cell_of_the_wrong_type(tmp_path):
    path = write(tmp_path, "bad.csv", "name,count,score,flag\nada,1,2,true\nbob,two,2,true\n")
    with pytest.raises(DatasetError, match=r"bad\.csv, line 3: field 'count' expects int, "
                                           r"got 'two'"):
        InMemDataset.from_csv(path, Row)
    path = write(tmp_path, "flag.csv", "name,count,score,flag\nada,1,2,maybe\n")
    with pytest.raises(DatasetError, match=r"line 2: field 'flag' expects bool, got 'maybe'"):
        InMemDataset.from_csv(path, Row)


def test_csv_columns_that_do_not_match_the_dataclass(tmp_path):
    path = write(tmp_path, "bad.csv", "name,count,colour\nada,1,red\n")
    with pytest.raises(DatasetError, match=r"bad\.csv, line 1: the columns do not match the "
                                           r"fields of Row \(missing flag, score; unknown "
                                           r"colour\)"):
        InMemDataset.from_csv(path, Row)


def test_csv_bad_files(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(DatasetFileNotFoundError, match=f"dataset file {re.escape(str(missing))} does not exist"):
        InMemDataset.from_csv(missing)
    with pytest.raises(FileNotFoundError):
        InMemDataset.from_csv(missing)
    with pytest.raises(DatasetError, match="the CSV file is empty, with no header row"):
        InMemDataset.from_csv(write(tmp_path, "empty.csv", ""))
    with pytest.raises(DatasetError, match="line 1: the header names column 'a' twice"):
        InMemDataset.from_csv(write(tmp_path, "dup.csv", "a,b,a\n1,2,3\n"))
    with pytest.raises(DatasetError, match="give columns exactly when the file has no header"):
        InMemDataset.from_csv(write(tmp_path, "x.csv", "1\n"), has_header=False)


def test_csv_converter_error_names_the_line(tmp_path):
    path = write(tmp_path, "n.csv", "x\n1\nzz\n")
    with pytest.raises(DatasetError, match=r"n\.csv, line 3: the item converter raised "
                                           r"ValueError"):
        InMemDataset.from_csv(path, lambda row: int(row["x"]))


# ------------------------------------------------------------------ JSON lines
def test_json_rows(tmp_path):
    path = write(tmp_path, "rows.jsonl",
                 '{"name": "ada", "count": 3, "score": 1, "flag": true}\n\n'
                 '{"name": "bob", "count": 4, "score": 0.25, "flag": false, "note": "x"}\n')
    assert InMemDataset.from_json_rows(path)[1]["note"] == "x"
    typed = InMemDataset.from_json_rows(path, Row)
    assert list(typed) == [Row("ada", 3, 1.0, True), Row("bob", 4, 0.25, False, "x")]
    assert type(typed[0].score) is float
    values = InMemDataset.from_json_rows(write(tmp_path, "v.jsonl", "[1, 2]\n3\n\"s\"\n"))
    assert list(values) == [[1, 2], 3, "s"]


def test_json_rows_bad_line(tmp_path):
    path = write(tmp_path, "bad.jsonl", '{"a": 1}\n{"a": 2\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl, line 2: not valid JSON") as info:
        InMemDataset.from_json_rows(path)
    assert info.value.line == 2 and info.value.file == str(path)


def test_json_rows_that_do_not_fit_the_dataclass(tmp_path):
    path = write(tmp_path, "a.jsonl", '{"name": "a", "count": 1, "score": 1.5, "flag": true}\n'
                                      '{"name": "b", "count": 1.5, "score": 1, "flag": true}\n')
    with pytest.raises(DatasetError, match=r"line 2: field 'count' expects int, got 1\.5"):
        InMemDataset.from_json_rows(path, Row)
    path = write(tmp_path, "b.jsonl", '{"name": "a", "count": 1, "score": 1}\n')
    with pytest.raises(DatasetError, match=r"line 1: the columns do not match the fields of Row "
                                           r"\(missing flag\)"):
        InMemDataset.from_json_rows(path, Row)
    path = write(tmp_path, "c.jsonl", "[1, 2]\n")
    with pytest.raises(DatasetError, match=r"line 1: expected an object with the fields of Row, "
                                           r"got list"):
        InMemDataset.from_json_rows(path, Row)
