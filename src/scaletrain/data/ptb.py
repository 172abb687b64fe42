"""Penn Treebank in Mikolov's preprocessed form, as used by Zaremba et al. (2014).

The text has one sentence per line, words separated by spaces, rare words already replaced by
``<unk>`` and numbers by ``N``; the vocabulary has exactly 10,000 words including ``<unk>`` and the
``<eos>`` marker that the reader appends at the end of every line. :func:`find_ptb` finds the texts
(they are never downloaded).

Example::

    >>> import tempfile
    >>> from pathlib import Path
    >>> path = Path(tempfile.mkdtemp()) / "ptb.valid.txt"
    >>> _ = path.write_text(" the cat <unk> \\n the dog \\n")
    >>> read_words(path)
    ['the', 'cat', '<unk>', '<eos>', 'the', 'dog', '<eos>']
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from scaletrain.data.files import read_dataset_bytes
from scaletrain.data.locate import ENV_DATA, Findable, cache_dir, search
from scaletrain.errors import ConfigError, DataError

__all__ = [
    "EOS",
    "PTB_SUBDIR",
    "PTB_VOCABULARY_SIZE",
    "TRAIN_SPLITS",
    "UNK",
    "PennTreebank",
    "Vocabulary",
    "build_vocabulary",
    "find_ptb",
    "load_ptb",
    "read_words",
]

EOS = "<eos>"
UNK = "<unk>"
PTB_VOCABULARY_SIZE = 10_000
#: Texts that ``load_ptb`` can train on.
TRAIN_SPLITS = ("train", "valid")
#: Subfolder of ``--data-dir`` and ``$SCALETRAIN_DATA`` that may hold the texts.
PTB_SUBDIR = "ptb"

_ARCHIVE = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
_ARCHIVE_HINT = f"the files come from the data/ folder of Mikolov's simple-examples archive ({_ARCHIVE})"
_REQUIRED = ("ptb.valid.txt", "ptb.test.txt")
_TRAIN = "ptb.train.txt"


def read_words(path: Path) -> list[str]:
    """Read a PTB text file as a list of words with ``<eos>`` after every sentence (non-blank line).

    Raises :class:`DataError` if the file is missing, not UTF-8, or holds no words.

    Example::

        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "t.txt"
        >>> _ = path.write_text("a b\\n\\nc")
        >>> read_words(path)
        ['a', 'b', '<eos>', 'c', '<eos>']
    """
    path = Path(path)
    raw = read_dataset_bytes(path, when_missing=f"{_ARCHIVE_HINT}; pass their folder with --data-dir")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path}: not UTF-8 text (bad byte at offset {exc.start}); this is not Mikolov's PTB text, {_ARCHIVE_HINT}"
        ) from exc
    words: list[str] = []
    # Only "\n" ends a sentence; str.splitlines would also split on form feeds and similar characters.
    for line in text.split("\n"):
        sentence = line.split()
        if sentence:
            words.extend(sentence)
            words.append(EOS)
    if not words:
        raise DataError(f"{path}: holds no words; the file is empty or damaged, {_ARCHIVE_HINT}")
    return words


@dataclass(frozen=True)
class Vocabulary:
    """Words in id order; ``index`` maps each word to its id.

    Example::

        >>> vocabulary = Vocabulary(("<eos>", "the", "<unk>"))
        >>> len(vocabulary), vocabulary.encode(["the", "zebra"]).tolist()
        (3, [1, 2])
    """

    words: tuple[str, ...]
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index = {word: position for position, word in enumerate(self.words)}
        if len(index) != len(self.words):
            duplicates = sorted(word for word, count in Counter(self.words).items() if count > 1)
            raise DataError(f"vocabulary lists these words more than once: {duplicates[:10]}")
        # Frozen dataclasses forbid attribute assignment, so set the derived field directly.
        object.__setattr__(self, "index", index)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, words: Iterable[str]) -> torch.Tensor:
        """Map words to a 1-D int64 tensor of ids; unknown words become ``<unk>`` if it is present.

        Example::

            >>> Vocabulary(("a", "b")).encode(["b", "a", "b"]).tolist()
            [1, 0, 1]
        """
        words = list(words)
        unknown_id = self.index.get(UNK)
        ids = [self.index.get(word, unknown_id) for word in words]
        if unknown_id is None and None in ids:
            unknown = sorted({word for word, word_id in zip(words, ids, strict=True) if word_id is None})
            raise DataError(
                f"{len(unknown)} words are not in the vocabulary and it has no {UNK} to stand for them "
                f"(first: {unknown[:5]}); the text is not Mikolov's preprocessed PTB, "
                f"{_ARCHIVE_HINT}"
            )
        return torch.tensor(ids, dtype=torch.int64)


def build_vocabulary(texts: Sequence[list[str]], size: int = PTB_VOCABULARY_SIZE) -> Vocabulary:
    """Build a vocabulary over all ``texts``: ids by descending frequency, ties alphabetical.

    ``size`` is the most words allowed; more distinct words raise :class:`DataError`, because
    Mikolov's PTB has exactly 10,000 (including ``<unk>`` and ``<eos>``).

    Example::

        >>> build_vocabulary([["b", "a", "b"], ["c", "a"]]).words
        ('a', 'b', 'c')
    """
    if size < 1:
        raise ConfigError(f"vocab_size must be at least 1, got {size}")
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(text)
    if not counts:
        raise DataError(f"cannot build a vocabulary from no words; {_ARCHIVE_HINT}")
    if len(counts) > size:
        raise DataError(
            f"the text has {len(counts)} distinct words, more than the vocabulary size {size}; it is not "
            f"Mikolov's preprocessed PTB, which has exactly {PTB_VOCABULARY_SIZE:,} words including {UNK} "
            f"and {EOS}; {_ARCHIVE_HINT}"
        )
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return Vocabulary(tuple(word for word, _ in ordered))


@dataclass(frozen=True)
class PennTreebank:
    """Encoded PTB texts (1-D int64 tensors of word ids) and their shared vocabulary.

    ``valid`` is ``None`` when the validation text is the training text (``train_split="valid"``),
    so that no one mistakes training loss for held-out loss.
    """

    train: torch.Tensor
    valid: torch.Tensor | None
    test: torch.Tensor
    vocabulary: Vocabulary


def load_ptb(directory: Path, *, train_split: str = "train", vocab_size: int = PTB_VOCABULARY_SIZE) -> PennTreebank:
    """Load ``ptb.{train,valid,test}.txt`` from ``directory`` and encode them with one vocabulary.

    ``train_split`` chooses the training text: ``"train"`` (the 929k-word ``ptb.train.txt``) or
    ``"valid"`` (for copies that only have the validation and test files; ``valid`` is then
    ``None``). The vocabulary is built from every file present, so ids agree across splits.

    Example::

        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "ptb.valid.txt").write_text("a b <unk>\\n")
        >>> _ = (folder / "ptb.test.txt").write_text("b a\\n")
        >>> data = load_ptb(folder, train_split="valid")
        >>> data.train.tolist(), data.valid is None, len(data.vocabulary)
        ([1, 2, 3, 0], True, 4)
    """
    if train_split not in TRAIN_SPLITS:
        raise ConfigError(f"train_split must be one of {', '.join(TRAIN_SPLITS)}, got {train_split!r}")
    directory = Path(directory)
    train_path = directory / "ptb.train.txt"
    if train_split == "train" and not train_path.is_file():
        raise DataError(
            f"{train_path}: not found; offline copies of PTB often hold only ptb.valid.txt and "
            f"ptb.test.txt. Get ptb.train.txt ({_ARCHIVE_HINT}) and put it in {directory}, or pass "
            "`-o train_split=valid` to train on the validation text instead"
        )
    valid_words = read_words(directory / "ptb.valid.txt")
    test_words = read_words(directory / "ptb.test.txt")
    train_words = read_words(train_path) if train_path.is_file() else None
    texts = [valid_words, test_words] if train_words is None else [train_words, valid_words, test_words]
    vocabulary = build_vocabulary(texts, vocab_size)
    valid = vocabulary.encode(valid_words)
    if train_split == "valid":
        return PennTreebank(train=valid, valid=None, test=vocabulary.encode(test_words), vocabulary=vocabulary)
    assert train_words is not None  # train_split == "train" was checked above
    return PennTreebank(
        train=vocabulary.encode(train_words),
        valid=valid,
        test=vocabulary.encode(test_words),
        vocabulary=vocabulary,
    )


def _with_training_text(folder: Path) -> Path | None:
    return folder if all((folder / name).is_file() for name in (*_REQUIRED, _TRAIN)) else None


def _with_valid_and_test(folder: Path) -> Path | None:
    return folder if all((folder / name).is_file() for name in _REQUIRED) else None


def _not_found(flag: str, searched: list[Path]) -> str:
    return (
        f"{flag}: ptb.valid.txt and ptb.test.txt not found; searched "
        f"{', '.join(str(folder) for folder in searched)}. The files ptb.train.txt, ptb.valid.txt and "
        f"ptb.test.txt come from the data/ folder of Mikolov's simple-examples archive ({_ARCHIVE}); "
        f"put them in a folder and pass it with --data-dir (or set {ENV_DATA})"
    )


def find_ptb(
    data_dir: Path | None,
    *,
    environ: Mapping[str, str] | None = None,
    system_dirs: Sequence[Path] | None = None,
) -> Path:
    """Return a folder holding Mikolov's ``ptb.valid.txt`` and ``ptb.test.txt`` (ideally ``ptb.train.txt``).

    Searched: ``data_dir`` and its ``ptb`` subfolder when given (then nowhere else), otherwise
    ``$SCALETRAIN_DATA`` (and ``ptb`` subfolder), then ``system_dirs`` (default: ``cache_dir()/ptb``).
    A folder that also has ``ptb.train.txt`` is preferred over an earlier one without it. Nothing is
    downloaded. Raises :class:`DataError` naming the places searched and where the files come from.

    Example::

        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> for name in ("ptb.valid.txt", "ptb.test.txt"):
        ...     _ = (folder / name).write_text("a b\\n")
        >>> find_ptb(folder) == folder
        True
    """
    ptb = Findable(
        name="Penn Treebank",
        subdirs=("", PTB_SUBDIR),
        found_in=(_with_training_text, _with_valid_and_test),
        not_in_data_dir=lambda data_dir, looked: _not_found(f"--data-dir {data_dir}", looked),
        not_found=lambda searched: _not_found("Penn Treebank", searched),
    )
    default_dirs = [cache_dir(environ) / PTB_SUBDIR] if system_dirs is None else system_dirs
    return search(ptb, data_dir, default_dirs, environ=environ)
