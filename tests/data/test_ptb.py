"""Penn Treebank reading, vocabulary and loading, on small texts and on the real files when present."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scaletrain.data.ptb import (
    EOS,
    UNK,
    Vocabulary,
    build_vocabulary,
    load_ptb,
    read_words,
)
from scaletrain.errors import ConfigError, DataError

REAL_PTB = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "ptb"


def write_ptb(folder: Path, *, train: str | None = "a a b <unk>\nc a\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ptb.valid.txt").write_text(" a b \n d <unk>\n")
    (folder / "ptb.test.txt").write_text(" b a \n")
    if train is not None:
        (folder / "ptb.train.txt").write_text(train)
    return folder


# --- read_words ------------------------------------------------------------------------------------


def test_read_words_appends_eos_per_line(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text(" no it was n't black monday \n but N \n")
    assert read_words(path) == ["no", "it", "was", "n't", "black", "monday", EOS, "but", "N", EOS]


def test_read_words_blank_lines_crlf_and_missing_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"a b\r\n\n   \nc")
    assert read_words(path) == ["a", "b", EOS, "c", EOS]


def test_read_words_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found") as error:
        read_words(tmp_path / "ptb.valid.txt")
    assert "ptb.valid.txt" in str(error.value)
    assert "simple-examples" in str(error.value)
    assert "--data-dir" in str(error.value)


@pytest.mark.parametrize("content", [b"", b"\n\n", b"  \t \n"])
def test_read_words_empty_text(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "ptb.valid.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match="holds no words") as error:
        read_words(path)
    assert str(path) in str(error.value)


def test_read_words_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "ptb.valid.txt"
    path.write_bytes(b"caf\xe9 au lait\n")
    with pytest.raises(DataError, match=r"not UTF-8 .*offset 3"):
        read_words(path)


# --- Vocabulary -------------------------------------------------------------------------------------


def test_build_vocabulary_orders_by_frequency_then_alphabet() -> None:
    vocabulary = build_vocabulary([["c", "b", "b", "a"], ["c", "d", "b"]])
    assert vocabulary.words == ("b", "c", "a", "d")
    assert vocabulary.index == {"b": 0, "c": 1, "a": 2, "d": 3}
    assert len(vocabulary) == 4


def test_vocabulary_counts_every_text() -> None:
    assert build_vocabulary([["x"], ["y", "y"]]).words == ("y", "x")


def test_too_many_distinct_words() -> None:
    words = [f"w{i}" for i in range(11)]
    with pytest.raises(DataError, match="11 distinct words, more than the vocabulary size 10") as error:
        build_vocabulary([words], size=10)
    assert "10,000" in str(error.value)
    assert len(build_vocabulary([words], size=11)) == 11


def test_vocabulary_size_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        build_vocabulary([["a"]], size=0)


def test_vocabulary_from_no_words() -> None:
    with pytest.raises(DataError, match="no words"):
        build_vocabulary([[], []])


def test_encode_maps_unknown_words_to_unk() -> None:
    vocabulary = Vocabulary(("the", UNK, EOS))
    ids = vocabulary.encode(["the", "zebra", EOS])
    assert ids.dtype == torch.int64
    assert ids.tolist() == [0, 1, 2]


def test_encode_unknown_words_without_unk() -> None:
    vocabulary = Vocabulary(("the", EOS))
    with pytest.raises(DataError, match=r"2 words are not in the vocabulary .*\['cat', 'zebra'\]"):
        vocabulary.encode(["zebra", "the", "cat", "zebra"])


def test_vocabulary_rejects_duplicates() -> None:
    with pytest.raises(DataError, match=r"more than once: \['a'\]"):
        Vocabulary(("a", "b", "a"))


def test_vocabulary_equality_ignores_the_derived_index() -> None:
    assert Vocabulary(("a", "b")) == Vocabulary(("a", "b"))
    assert hash(Vocabulary(("a", "b"))) == hash(Vocabulary(("a", "b")))


# --- load_ptb ---------------------------------------------------------------------------------------


def test_load_ptb_shares_one_vocabulary(tmp_path: Path) -> None:
    data = load_ptb(write_ptb(tmp_path))
    vocabulary = data.vocabulary
    # Counted over train, valid and test together: <eos> and a 5 times each ("<" sorts first), b 3,
    # <unk> 2, c and d once.
    assert vocabulary.words == (EOS, "a", "b", UNK, "c", "d")
    decode = [vocabulary.words[i] for i in data.train.tolist()]
    assert decode == ["a", "a", "b", UNK, EOS, "c", "a", EOS]
    assert data.valid is not None
    assert [vocabulary.words[i] for i in data.valid.tolist()] == ["a", "b", EOS, "d", UNK, EOS]
    assert [vocabulary.words[i] for i in data.test.tolist()] == ["b", "a", EOS]


def test_train_split_valid_trains_on_the_validation_text(tmp_path: Path) -> None:
    data = load_ptb(write_ptb(tmp_path, train=None), train_split="valid")
    assert data.valid is None
    assert [data.vocabulary.words[i] for i in data.train.tolist()] == ["a", "b", EOS, "d", UNK, EOS]
    assert "c" not in data.vocabulary.index


def test_train_split_valid_still_uses_the_training_vocabulary(tmp_path: Path) -> None:
    with_train = load_ptb(write_ptb(tmp_path), train_split="valid")
    assert "c" in with_train.vocabulary.index
    assert torch.equal(with_train.train, load_ptb(tmp_path).valid)


def test_missing_training_text_suggests_train_split_valid(tmp_path: Path) -> None:
    folder = write_ptb(tmp_path, train=None)
    with pytest.raises(DataError) as error:
        load_ptb(folder)
    message = str(error.value)
    assert "ptb.train.txt" in message
    assert "train_split=valid" in message
    assert "simple-examples" in message


def test_unknown_train_split(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="train, valid"):
        load_ptb(write_ptb(tmp_path), train_split="test")


def test_load_ptb_vocabulary_too_large(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="6 distinct words"):
        load_ptb(write_ptb(tmp_path), vocab_size=5)


def test_load_ptb_empty_file(tmp_path: Path) -> None:
    folder = write_ptb(tmp_path)
    (folder / "ptb.test.txt").write_text("\n")
    with pytest.raises(DataError, match=r"ptb\.test\.txt: holds no words"):
        load_ptb(folder)


@pytest.mark.skipif(not (REAL_PTB / "ptb.valid.txt").is_file(), reason=f"real PTB text not found in {REAL_PTB}")
def test_real_ptb_validation_and_test_text() -> None:
    valid = read_words(REAL_PTB / "ptb.valid.txt")
    test = read_words(REAL_PTB / "ptb.test.txt")
    # Words plus one <eos> per sentence: 70,390 + 3,370 and 78,669 + 3,761.
    assert len(valid) == 73_760
    assert valid.count(EOS) == 3_370
    assert len(test) == 82_430
    data = load_ptb(REAL_PTB, train_split="valid")
    assert data.train.shape == (73_760,)
    assert data.test.shape == (82_430,)
    assert {UNK, EOS, "N"} <= set(data.vocabulary.words)
    assert len(data.vocabulary) == 7_596  # words of valid and test together, below the 10,000 limit
    assert data.vocabulary.words[0] == "the"
