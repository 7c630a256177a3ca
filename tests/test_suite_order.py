"""`make test` starts the longest test files first (tests/conftest.py LONGEST_FILES): a listed file that was renamed
or removed would silently fall back to the end of the run."""

from pathlib import Path

from conftest import LONGEST_FILES, collection_rank

TESTS = Path(__file__).resolve().parent


def test_every_listed_long_file_exists_and_ranks_in_the_listed_order():
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
    for i, rel in enumerate(LONGEST_FILES):
        assert (TESTS / rel).is_file(), rel
        assert collection_rank(TESTS / rel) == i
    assert collection_rank(TESTS / "test_config.py") == len(LONGEST_FILES)  # any other file: after them
