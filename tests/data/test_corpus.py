from pathlib import Path

import pytest

from k3scale.data.corpus import (
    Document,
    held_out_ids,
    join_documents,
    normalize_document,
    read_text_documents,
    split_in_distribution,
)
from k3scale.errors import K3ScaleError


def _docs(n: int) -> list[Document]:
    return [Document(doc_id=f"d/{i}", text=f"text {i}") for i in range(n)]


def test_normalize_unwraps_paragraphs_and_drops_blank_lines():
    raw = "  First line\r\nwrapped   here.\n\n\n\tSecond\tparagraph.  \n\n"
    assert normalize_document(raw) == "First line wrapped here.\nSecond paragraph."


def test_normalize_composes_unicode():
    assert normalize_document("pre\u0065\u0308minent") == "pre\u00ebminent"


def test_held_out_choice_is_seeded_and_order_independent():
    docs = _docs(200)
    chosen = held_out_ids(docs, 0.05, seed=0, salt="x")
    assert len(chosen) == 10
    assert held_out_ids(list(reversed(docs)), 0.05, seed=0, salt="x") == chosen
    assert held_out_ids(docs, 0.05, seed=1, salt="x") != chosen


def test_split_in_distribution_is_disjoint_and_complete():
    docs = _docs(101)
    train, val = split_in_distribution(docs, seed=0, salt="s")
    train_ids, val_ids = {d.doc_id for d in train}, {d.doc_id for d in val}
    assert not train_ids & val_ids
    assert train_ids | val_ids == {d.doc_id for d in docs}
    assert len(val) == 3  # ceil(2% of 101)


def test_split_needs_two_documents():
    with pytest.raises(K3ScaleError, match="at least 2 documents"):
        split_in_distribution(_docs(1), seed=0, salt="s")


def test_read_folder_one_document_per_file(tmp_path: Path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("bee\n")
    (tmp_path / "sub" / "a.txt").write_text("ay\n\nsecond paragraph\n")
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "ignored.md").write_text("not text")
    docs = read_text_documents(tmp_path, "t")
    assert [d.doc_id for d in docs] == ["t/b.txt", "t/sub/a.txt"]
    assert docs[1].text == "ay\nsecond paragraph"


def test_read_single_file_one_document_per_paragraph(tmp_path: Path):
    path = tmp_path / "one.txt"
    path.write_text("p one\nwrapped\n\np two\n\n\np three\n")
    docs = read_text_documents(path, "t")
    assert [d.text for d in docs] == ["p one wrapped", "p two", "p three"]
    assert read_text_documents(_written(tmp_path, join_documents(docs)), "t") == docs


def _written(folder: Path, text: str) -> Path:
    path = folder / "round_trip.txt"
    path.write_text(text)
    return path


def test_empty_folder_is_a_clear_error(tmp_path: Path):
    with pytest.raises(K3ScaleError, match=r"no non-empty \.txt"):
        read_text_documents(tmp_path, "t")


def test_non_utf8_is_a_clear_error(tmp_path: Path):
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(K3ScaleError, match="not UTF-8"):
        read_text_documents(tmp_path, "t")
