"""JSONL prompt files with slices: `file.jsonl@[start:end]`."""

import json
import sys

import pytest

from slime.utils.data_files import DataFileError, parse_data_spec, read_jsonl, to_items

NUM_GPUS = 0


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"prompt": f"q{i}", "label": str(i)}) for i in range(10)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_whole_file(data):
    assert [r["prompt"] for r in read_jsonl(str(data))] == [f"q{i}" for i in range(10)]


@pytest.mark.parametrize(
    ("sl", "py"),
    [
        ("[2:5]", slice(2, 5)),
        ("[:3]", slice(None, 3)),
        ("[8:]", slice(8, None)),
        ("[-2:]", slice(-2, None)),
        ("[1:-7]", slice(1, -7)),
        ("[5:5]", slice(5, 5)),
        ("[8:100]", slice(8, 100)),
        ("[:]", slice(None, None)),
    ],
)
def test_slices_follow_python_semantics(data, sl, py):
    got = [int(r["label"]) for r in read_jsonl(f"{data}@{sl}")]
    assert got == list(range(10))[py]


def test_slice_stops_reading_at_its_end(data):
    # A corrupt line after the slice is never read: the slice streams.
    with data.open("a") as f:
        f.write("{this is not json\n")
    assert len(read_jsonl(f"{data}@[0:3]")) == 3
    with pytest.raises(DataFileError, match=r"prompts\.jsonl:11: not valid JSON"):
        read_jsonl(f"{data}@[-2:]")


def test_blank_lines_are_skipped(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "a"}\n\n   \n{"prompt": "b"}\n')
    assert [r["prompt"] for r in read_jsonl(str(p))] == ["a", "b"]


def test_path_with_at_sign_and_brackets(tmp_path):
    p = tmp_path / "v@2[final].jsonl"
    p.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    assert read_jsonl(f"{p}@[1:]") == [{"prompt": "b"}]
    assert parse_data_spec(f"{p}@[1:]").path == p


@pytest.mark.parametrize("spec", ["d.jsonl@[1]", "d.jsonl@[a:b]", "d.jsonl@[1:2:3]"])
def test_bad_specs(spec):
    with pytest.raises(DataFileError, match=r"file\.jsonl@"):
        parse_data_spec(spec)


def test_missing_file_and_non_object_records(tmp_path):
    with pytest.raises(DataFileError, match="no such file"):
        read_jsonl(str(tmp_path / "nope.jsonl"))
    p = tmp_path / "list.jsonl"
    p.write_text("[1, 2]\n")
    with pytest.raises(DataFileError, match="is a list, not an object"):
        read_jsonl(str(p))


def test_items(data):
    items = to_items(read_jsonl(f"{data}@[0:2]"))
    assert items == [("q0", "0"), ("q1", "1")]
    assert to_items([{"question": "x"}], prompt_key="question") == [("x", None)]
    with pytest.raises(DataFileError, match="no 'prompt' key"):
        to_items([{"question": "x"}])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
